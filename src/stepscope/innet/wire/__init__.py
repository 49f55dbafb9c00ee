"""The wire: the version-1 packet format (`protocol`), float32 <-> int32 quantization with shared exponents
(`quantize`), batched datagram I/O (`batch_io`, over the system calls of `mmsg`), and which data path runs
(`fastpath`: the C extension `innet._fastpath`, built from `innet/csrc/`, or numpy). Imports nothing else of
`innet` but that extension."""
