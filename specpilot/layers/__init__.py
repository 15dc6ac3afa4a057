"""nn.Modules shared by the model families; each calls ops/ public functions for its kernels."""
