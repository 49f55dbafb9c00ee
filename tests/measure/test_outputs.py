"""Output files: one trace per sweep point and per rank (a real gloo process group), writability checks."""

import pytest
import torch.distributed as dist

from stepscope.errors import UsageError
from stepscope.measure.outputs import point_path, rank_path
from stepscope.results.files import check_writable_dir, check_writable_file
from tests.conftest import free_port


def test_point_and_rank_names(tmp_path):
    trace = tmp_path / "trace.json"
    assert point_path(trace, 0, 1) == trace
    assert point_path(trace, 2, 3) == tmp_path / "trace.p2.json"
    assert rank_path(trace) == trace  # not distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        assert rank_path(trace) == tmp_path / "trace.rank0.json"
        assert rank_path(point_path(trace, 1, 2)) == tmp_path / "trace.p1.rank0.json"
    finally:
        dist.destroy_process_group()


def test_writability_is_checked_without_leaving_files(tmp_path):
    target = tmp_path / "sub" / "trace.json"
    assert check_writable_file(target, "the trace") == target and not target.exists() and target.parent.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write the trace"):
        check_writable_file(blocker / "trace.json", "the trace")
    with pytest.raises(UsageError, match="cannot write plots"):
        check_writable_dir(blocker / "plots", "plots")
    with pytest.raises(UsageError, match="is a directory"):
        check_writable_file(tmp_path, "the trace")


def test_a_file_where_a_folder_is_expected_is_named_as_such(tmp_path, cli):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match=r"cannot write plots to .*file: it is a file, not a folder \(give a folder"):
        check_writable_dir(blocker, "plots")
    with pytest.raises(UsageError, match=r"file is a file, not a folder"):  # a folder under a file
        check_writable_dir(blocker / "plots", "plots")
    assert blocker.read_text() == "x"
    # end to end: `memory --plot-dir FILE` is one line, exit 2, nothing recorded (not "File exists")
    code, _, err = cli("memory", "--model", "tiny", "--batch", "1", "--seq", "8", "--out", tmp_path / "out",
                       "--plot-dir", blocker)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"cannot write timeline plots to {blocker}: it is a file, not a folder" in err
    assert "File exists" not in err and not (tmp_path / "out" / "memory.jsonl").exists()
