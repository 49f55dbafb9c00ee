"""The nccl-tests text format: our records written and parsed back, and logs in nccl-tests' own layouts
(current, 2019-2021, with MPI noise in between) imported, also through `stepscope comm --import`."""

import pytest

from stepscope.distributed.collectives.nccl_tests_format import (
    format_time_us,
    import_records,
    parse_nccl_tests,
    write_nccl_tests,
)
from stepscope.distributed.collectives.points import plan_points
from stepscope.distributed.collectives.rank import timing_metrics
from stepscope.errors import UsageError
from stepscope.results.store import make_record, read_records

# The layout nccl-tests 2.18 prints (two hosts, MPI warnings interleaved); the numbers are made up.
CURRENT_LOG = """\
--------------------------------------------------------------------------
Two mutually-exclusive MCA variables were specified.
--------------------------------------------------------------------------
# nccl-tests version 2.18.3 nccl-headers=23003 nccl-library=23003
# Collective test starting: all_gather_perf
# nThread 1 nGpus 1 minBytes 1024 maxBytes 4194304 step: 4(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid    653 on    node-a device  0 [0000:06:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid    654 on    node-a device  1 [0000:09:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid    641 on    node-b device  0 [0000:06:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid    642 on    node-b device  1 [0000:09:00] NVIDIA H100 80GB HBM3
NCCL version 2.21.5+cuda12.4
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
        1024            64     float    none      -1    20.00    0.05    0.04       0    19.50    0.05    0.04       0
       16384          1024     float    none      -1    25.00    0.66    0.49       0    24.00    0.68    0.51       0
[node-a:00648] 3 more processes have sent help message help-mca-var.txt / mutually-exclusive-vars
      262144         16384     float    none      -1    60.10    4.36    3.27       0    58.70    4.47    3.35       0
     4194304        262144     float    none      -1   512.30    8.19    6.14       2    510.9    8.21    6.16     N/A
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 2.5 
#
# Collective test concluded: all_gather_perf
"""

# The 2019-2021 layout: no root column, `error` (max deviation) instead of #wrong, no op line.
OLD_LOG = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid   1320 on   host-1 device  0 [0x00] Tesla V100-SXM2-16GB
#   Rank  1 Pid   1320 on   host-1 device  1 [0x00] Tesla V100-SXM2-16GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        8192          2048   float     sum    16.57    0.49    0.49  0e+00    13.83    0.59    0.59  0e+00
       65536         16384   float     sum    23.07    2.84    2.84  1e-06    18.39    3.56    3.56  0e+00
# Out of bounds values : 0 OK
"""

# nccl-tests `-o all` style: every size once per reduction (sum and prod), on 2 ranks; numbers made up.
REDOP_LOG = """\
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 1024 maxBytes 1048576 step: 32(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on     node-a device  0 [0000:06:00] NVIDIA A100
#  Rank  1 Group  0 Pid   1002 on     node-a device  1 [0000:07:00] NVIDIA A100
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    11.11    0.09    0.09      0    11.22    0.09    0.09      0
        1024           256     float    prod      -1    33.33    0.03    0.03      0    33.44    0.03    0.03      0
       32768          8192     float     sum      -1    14.00    2.34    2.34      0    13.90    2.36    2.36      0
       32768          8192     float    prod      -1    44.00    0.74    0.74      0    43.90    0.75    0.75      0
     1048576        262144     float     sum      -1    99.00   10.59   10.59      0    98.00   10.70   10.70      0
     1048576        262144     float    prod      -1   199.00    5.27    5.27      0   198.00    5.30    5.30      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 3.7
#
# Collective test concluded: all_reduce_perf
"""


def test_time_column_precision_like_nccl_tests():
    assert format_time_us(12.345) == "  12.35" and format_time_us(512.3) == "  512.3"
    assert format_time_us(12345.6) == "  12346"


def _records():
    points, _, _ = plan_points(backend="mpi", world_size=3, ops=["all_reduce", "all_gather", "broadcast"],
                               sizes=[1 << 10, 1 << 20], dtypes=["fp32"], modes=["per-op"], places=["out", "in"],
                               iters=20, warmup=5)
    env = {"device_name": "Some CPU", "ranks": [{"host": "h0", "pid": 10 + r, "device": "cpu"} for r in range(3)]}
    records = []
    for i, point in enumerate(points):
        if point.op == "broadcast" and not point.in_place:
            records.append(make_record("comm", point.config(), {}, status="unsupported", env=env, note="in place only"))
            continue
        times = [(50 + i) * 1e-6, (45 + i) * 1e-6, (52 + 3 * i) * 1e-6]
        wrong = i % 2
        records.append(make_record("comm", point.config(), timing_metrics(point, times, wrong=wrong), env=env,
                                   status="mismatch" if wrong else "ok"))
    return records


def test_our_records_round_trip_through_the_parser(tmp_path):
    records = _records()
    text = write_nccl_tests(records)
    assert text.count("# Collective test starting:") == 3 and "# Out of bounds values : " in text
    path = tmp_path / "ours.log"
    path.write_text(text)
    parsed = import_records(path)
    measured = [r for r in records if r["status"] != "unsupported"]
    assert len(parsed) == len(measured)
    for original, back in zip(measured, parsed, strict=True):
        for field in ("backend", "op", "world_size", "size_bytes", "count", "dtype", "mode", "in_place", "iters",
                      "warmup"):
            assert back["config"][field] == original["config"][field], field
        assert back["config"].get("root") == original["config"].get("root")
        om, bm = original["metrics"], back["metrics"]
        assert bm["time_us_max"] == pytest.approx(om["time_us_max"], abs=0.006)  # printed with 2 decimals
        assert bm["busbw_GBps"] == pytest.approx(om["busbw_GBps"], abs=0.006)
        assert bm["algbw_GBps"] == pytest.approx(om["algbw_GBps"], abs=0.006)
        assert bm["wrong"] == om["wrong"] and back["status"] == original["status"]
    assert parsed[0]["env"]["hosts"] == ["h0"] and parsed[0]["env"]["device_name"] == "Some CPU"


def test_a_current_nccl_tests_log_with_noise_imports(tmp_path):
    path = tmp_path / "allgather.log"
    path.write_text(CURRENT_LOG)
    records = import_records(path)
    assert len(records) == 8  # 4 sizes x 2 placements (a #wrong of N/A means "not checked")
    first = records[0]
    assert first["config"]["op"] == "all_gather" and first["config"]["world_size"] == 4
    assert first["config"]["mode"] == "batch" and first["config"]["iters"] == 20 and first["config"]["warmup"] == 1
    assert first["config"]["dtype"] == "fp32" and first["config"]["backend"] == "nccl"
    assert first["metrics"] == {"time_us_mean": 20.0, "algbw_GBps": 0.05, "busbw_GBps": 0.04, "wrong": 0}
    assert first["env"]["hosts"] == ["node-a", "node-b"] and "H100" in first["env"]["device_name"]
    assert first["env"]["nccl_version"] == "NCCL version 2.21.5+cuda12.4"
    last_out = [r for r in records if r["config"]["size_bytes"] == 4194304 and not r["config"]["in_place"]][0]
    assert last_out["status"] == "mismatch" and last_out["metrics"]["wrong"] == 2
    last_in = [r for r in records if r["config"]["size_bytes"] == 4194304 and r["config"]["in_place"]][0]
    assert last_in["status"] == "ok" and "wrong" not in last_in["metrics"]


def test_an_old_layout_needs_an_op_hint(tmp_path):
    path = tmp_path / "old.log"
    path.write_text(OLD_LOG)
    with pytest.raises(UsageError, match="pass --op"):
        import_records(path)
    records = import_records(path, op_hint="all_reduce")
    assert len(records) == 4 and {r["config"]["world_size"] for r in records} == {2}
    assert records[2]["metrics"]["max_error"] == pytest.approx(1e-6) and "wrong" not in records[2]["metrics"]
    assert records[1]["config"]["in_place"] and records[1]["metrics"]["time_us_mean"] == pytest.approx(13.83)


def test_text_without_results_is_rejected(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("# nothing here\nhello\n")
    assert parse_nccl_tests(path.read_text()) == []
    with pytest.raises(UsageError, match="no nccl-tests results"):
        import_records(path)


def test_comm_import_command(cli, tmp_path):
    log = tmp_path / "allgather.log"
    log.write_text(CURRENT_LOG)
    out = tmp_path / "results"
    code, stdout, stderr = cli("comm", "--import", log, "--out", out, "--fit")
    assert code == 1  # the log holds a point with wrong elements: reported, like nccl-tests' FAILED
    assert "imported 8 point(s)" in stdout and "nccl all_gather | 4 ranks | fp32 | batch" in stdout
    assert "returned wrong results" in stderr
    stored = read_records(out / "comm.jsonl")
    assert sum(r["config"]["record"] == "point" for r in stored) == 8
    fits = [r for r in stored if r["config"]["record"] == "fit"]
    assert fits and all(f["metrics"]["alpha_us"] >= 0 and f["metrics"]["beta_GBps"] > 0 for f in fits)
    assert (out / "comm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, stderr = cli("comm", "--import", tmp_path / "missing.log", "--out", out)
    assert code == 2 and stderr.count("\n") == 1 and "cannot read" in stderr


def test_rows_that_differ_only_by_redop_stay_apart(cli, tmp_path):
    from stepscope.distributed.collectives.alpha_beta import headline_time_us
    from stepscope.distributed.collectives.report import fit_rows, flat_rows, table_blocks

    log = tmp_path / "allreduce_ops.log"
    log.write_text(REDOP_LOG)
    records = import_records(log)
    assert len(records) == 12 and {r["config"].get("redop") for r in records} == {None, "prod"}  # None = sum
    blocks = dict(table_blocks(records))
    assert set(blocks) == {"nccl all_reduce | 2 ranks | fp32 | batch | sum",
                           "nccl all_reduce | 2 ranks | fp32 | batch | prod"}
    assert [r["out_time_us"] for r in blocks["nccl all_reduce | 2 ranks | fp32 | batch | sum"]] == [11.11, 14.0, 99.0]
    assert [r["in_time_us"] for r in blocks["nccl all_reduce | 2 ranks | fp32 | batch | prod"]] == [33.44, 43.9, 198.0]
    assert [row["redop"] for row in flat_rows(records)[:4]] == ["sum", "sum", "prod", "prod"]
    text = write_nccl_tests(records)
    assert text.count("# Collective test starting:") == 2 and "    prod      -1    33.33" in text
    back = import_records(_write(tmp_path / "back.log", text))

    def timings(rs):
        return sorted((r["config"].get("redop") or "sum", r["config"]["in_place"], r["config"]["size_bytes"],
                       headline_time_us(r["metrics"])) for r in rs)

    assert timings(back) == timings(records)
    code, stdout, stderr = cli("comm", "--import", log, "--out", tmp_path / "r", "--fit", "--no-plot")
    assert code == 0, stderr
    assert "batch | sum" in stdout and "batch | prod" in stdout and "33.33" in stdout and "11.11" in stdout
    fits = [r for r in read_records(tmp_path / "r" / "comm.jsonl") if r["config"]["record"] == "fit"]
    assert sorted((f["config"].get("redop") or "sum", f["config"]["in_place"]) for f in fits) == \
        [("prod", False), ("prod", True), ("sum", False), ("sum", True)]
    assert {row["redop"] for row in fit_rows(fits)} == {"sum", "prod"}


def _write(path, text):
    path.write_text(text)
    return path
