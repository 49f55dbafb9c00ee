"""The command line, on top of everything: one thin module per command (`main.COMMANDS`) parses its options,
calls one library function and prints what it returns; the library writes the records, so the same call from
Python writes the same ones. `options` declares the options several commands share (each default read from the
config dataclass it fills), `output` prints rows in every format. No module outside this package imports it."""
