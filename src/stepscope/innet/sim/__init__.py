"""A discrete-event model of the protocol at line rate, without sockets: `config` (`SimConfig`), `model`
(`simulate`), `sweep` (`run_simulate`, the records). Imports `innet.wire` and `innet.worker.faults`."""
