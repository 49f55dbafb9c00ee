"""The software switch: `server` (one UDP socket, the job table, timers), `job` (one job's slots, versions,
bitmaps, straggler timers and counters), `aggregate` (a batch of contributions at once, numpy) and `fast_batch`
(the same in C, packet by packet), `process` (the switch as a separate process, `stepscope innet switch`).
Imports `innet.wire` only."""
