"""The wire: the version-1 packet format (`protocol`), float32 <-> int32 quantization with shared exponents
(`quantize`), and batched datagram I/O (`batch_io`, over the system calls of `mmsg`). Imports nothing else of
`innet`."""
