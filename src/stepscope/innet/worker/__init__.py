"""The all-reduce client: `client` (`InnetJob`, join and reduce), `config` (`JobConfig`), `engine` (the socket
and I/O thread), `stream` (slot bookkeeping), `op` (one all-reduce's blocks), `rto` (retransmission timeout),
`faults` (fault injection around the socket, stragglers), `ddp_hook` (DDP communication hook; imports torch).
Imports `innet.wire` (and `innet.switch.job` for one error message's memory figure)."""
