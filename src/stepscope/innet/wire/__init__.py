"""The wire: the version-1 packet format (`protocol`) and float32 <-> int32 quantization with shared exponents
(`quantize`). Imports nothing else of `innet`."""
