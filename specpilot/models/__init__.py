"""Target and drafter networks: one file per architecture family, assembled from layers/."""
