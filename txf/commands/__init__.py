"""One module per ``txf`` command; each defines its absl flags and a ``main(argv)``."""
