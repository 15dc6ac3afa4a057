"""The pilot: the ceilings of the present device (ceilings.py), their calibration cached per GPU and model
(calibration.py), the cost model of a speculative step against those ceilings (cost_model.py) and
`specpilot profile` (profile.py, commands.py). Layered after bench/ (it drives synthetic-acceptance runs) and
before cli.py."""
