"""The pure scheduling core: no I/O, no clock, no randomness. Imports only the stdlib."""
