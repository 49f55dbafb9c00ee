"""The software switch: `server` (one UDP socket, the job table, timers), `job` (one job's slots, versions,
bitmaps, straggler timers and counters), `process` (the switch as a separate process, `stepscope innet
switch`). Imports `innet.wire` only."""
