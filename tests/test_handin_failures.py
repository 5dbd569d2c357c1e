"""A hand-in's failure is the hand-in's, never the grader's: whatever its ranks return or do to the
processes above them costs its own parts, on their own clocks, and leaves the correct hand-ins
graded beside it untouched; `grade` never calls it the machine's (no infra_error, no exit 3).

Graded in one batch by the real command line, as root and as an ordinary user (marker configs):
the reference, a hand-in whose every part returns a 1024 x 1024 tensor, and ranks that signal their
leader, interrupt or stop every process they can. Beside them: the frame bounds alone, the message
of a zip that cannot be unpacked, and the zygote's command line.
"""

import errno
import io
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from grader import kit
from grader.intake.handin import HandinError, extract_zip
from grader.rerun.wire import bounds, channel, protocol
from grader.rerun.executor import WarmExecutor
from grader.rerun.wire.protocol import RankStatus, Result, StopReason, WorldJob, WorldReport
from grader.rubric import load_rubric
from tests.corpus import FULL, REFERENCE, ROOT, Files, zip_bytes
from tests.hostile import ATTACKS, build, returns_huge
from tests.test_sandbox import CONFIG_PARAMS, RUBRIC, _ta_or_skip
from tests import tas

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

SIGNALS = ("signal_the_leader", "interrupt_everyone", "stop_everyone")
DEFAULT = {"input_dim": 64, "output_dim": 32, "hidden_dim": 128, "global_batch_size": 128}


# ---- the bounds alone ---------------------------------------------------------------------------

def test_a_tensor_past_its_parts_size_is_refused_before_it_is_framed():
    with pytest.raises(bounds.TooLarge) as refused:
        bounds.encode(torch.ones(1024, 1024), "baseline", DEFAULT)
    assert refused.value.values == 1 << 20
    assert bounds.encode(torch.ones(64, 32), "baseline", DEFAULT)["shape"] == [64, 32]
    assert bounds.encode(torch.ones(32, 64), "baseline", DEFAULT)["shape"] == [32, 64]   # a wrong shape: the verdict's


def test_the_supervisor_refuses_what_a_rank_forged_past_its_size():
    huge = channel.encode_tensor(torch.ones(512, 512))
    forged = Result(part="baseline", status=RankStatus.OK, weight=huge, extra={"x": huge},
                    comm=[{"op": "all_reduce" * 100, "numel": 1}] * 5000, devices=list(range(500)))
    held = bounds.hold(forged, DEFAULT, 4)
    assert (held.status, held.weight, held.extra, held.oversize) == (RankStatus.CRASHED, None, {}, 512 * 512)
    assert len(held.comm) == bounds.COMM and len(held.comm[0]["op"]) == 40 and len(held.devices) == bounds.DEVICES
    # Lying about the shape does not help: the data counts as much.
    lying = dict(huge, shape=[2])
    assert bounds.hold(Result(part="baseline", status=RankStatus.OK, weight=lying), DEFAULT, 4).oversize >= 512 * 512
    right = channel.encode_tensor(torch.ones(64, 32))
    kept = bounds.hold(Result(part="baseline", status=RankStatus.OK, weight=dict(right, junk="x" * 100)), DEFAULT, 4)
    assert kept.status == RankStatus.OK and kept.weight == right


def test_a_world_report_is_made_to_fit_its_frame_part_by_part():
    """Every rank of every part at the largest a part may return, past what one frame holds: the
    largest parts are refused, one at a time, the rest of the report kept."""
    big = {"input_dim": 1024, "output_dim": 256, "global_batch_size": 8}
    weight = channel.encode_tensor(torch.ones(1024, 256))   # 2.8 MB a rank, 11 MB a part: two do not fit
    small = channel.encode_tensor(torch.ones(2, 2))
    parts = ["baseline", "grad_accumulation", "data_parallel"]
    report = WorldReport(completed=parts, results={
        p: {r: Result(part=p, status=RankStatus.OK, weight=weight if p != "baseline" else small) for r in range(4)}
        for p in parts}, abort=protocol.Abort(reason=protocol.StopReason.PROTOCOL, detail="x" * 10 ** 6))
    assert bounds.allowed("data_parallel", big) >= 1024 * 256
    fitted = bounds.fit(report)
    body = json.dumps(protocol.encode(fitted)).encode()
    assert len(body) <= channel.MAX_MESSAGE_BYTES
    statuses = {p: {m.status for m in ranks.values()} for p, ranks in fitted.results.items()}
    assert statuses["baseline"] == {RankStatus.OK}
    assert sorted(map(len, (statuses["grad_accumulation"], statuses["data_parallel"]))) == [1, 1]
    assert statuses["grad_accumulation"] | statuses["data_parallel"] == {RankStatus.OK, RankStatus.CRASHED}
    assert len(fitted.abort.detail) == bounds.DETAIL
    # What the leader sends is what fit leaves, whether it had to cut (as here) or not.
    for message in (report, WorldReport(completed=["baseline"], results={"baseline": {0: Result(
            part="baseline", status=RankStatus.OK, weight=small)}}), protocol.Hello()):
        sent = bounds.fitted_body(message)
        assert sent == channel.body_of(protocol.encode(bounds.fit(message)))


def test_a_frame_past_the_limit_is_never_written():
    read, write = os.pipe()
    try:
        with pytest.raises(channel.ChannelError):
            channel.send_framed(write, 1, {"type": "x", "data": "y" * channel.MAX_MESSAGE_BYTES})
        os.set_blocking(read, False)
        with pytest.raises(BlockingIOError):
            os.read(read, 1)   # not a byte of it
    finally:
        os.close(read)
        os.close(write)


def test_the_refusal_names_sizes_at_a_public_check_only():
    public = bounds.refusal("baseline", 1 << 20, DEFAULT, hidden=False)
    assert public == "the part returned a tensor of 1048576 values; it should return the weight, 64 x 32"
    hidden = bounds.refusal("baseline", 1 << 20, DEFAULT, hidden=True)
    assert not any(c.isdigit() for c in hidden) and "should return the weight" in hidden


# A zygote whose every world's leader dies in the middle of its report (its ranks killed it): the
# report's frame is cut short, then the zygote says it is ready again, as a real one does.
TORN = textwrap.dedent("""
    import os
    from grader.rerun.wire import channel, protocol
    send = lambda world, message: channel.send_framed(1, world, protocol.encode(message))
    send(0, protocol.Hello(isolation={"sandbox": "none"}))
    channel.read_framed(0)   # Setup: the kit's folder
    world = None
    while True:
        frame = channel.read_framed(0, skip_world=world)   # the data key its leader left unread
        if frame is None or frame[1]["type"] == "exit":
            break
        world, job = frame[0], channel.read_framed(0)[1]
        os.write(1, channel.FRAME.pack(channel.MARK, world, 5000, 0) + b'{"type":"world_report","completed":')
        send(world, protocol.Hello())
""")


class TearsEveryReport(WarmExecutor):
    def _command(self):
        return [sys.executable, "-c", TORN], [], None, []


@pytest.mark.timeout(120)
def test_a_report_its_world_tore_is_the_worlds_failure_at_once():
    """Not a wait of the world's whole budget and the machine's infra_error: the zygote is ready
    again, so the world's own bytes were torn; the next world runs on the same zygote."""
    executor = TearsEveryReport(sandbox="off")
    job = WorldJob(work_dir="/nonexistent", code={}, store="", world_size=1, parts=["baseline"], check={},
                   pg_timeout=1.0, limits={})
    try:
        executor.start()
        started, pid = time.monotonic(), executor._proc.pid
        first, second = executor.run_world(job), executor.run_world(job)
        elapsed, same = time.monotonic() - started, executor._proc.pid == pid
    finally:
        executor.close()
    assert [first.abort.reason, second.abort.reason] == [StopReason.RANK_DIED] * 2
    assert "without a whole report" in first.abort.detail
    assert elapsed < 30 and same   # one zygote for both, no wait for a report that cannot come


def test_a_leader_that_is_stopped_is_killed_and_its_world_lost_not_hung():
    """Where a world has no PID namespace of its own (`--sandbox off` as an ordinary user) a rank can
    stop its leader: the zygote reaps it killed, and says the world was lost, at once."""
    from grader.rerun.zygote import _reap
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    started = time.monotonic()
    assert _reap(pid) == -signal.SIGKILL and time.monotonic() - started < 10


@pytest.mark.timeout(300)
def test_the_zygote_and_so_every_leader_ignore_what_a_rank_could_send():
    """The kernel's own view of the real zygote (every leader is forked from it): the signals a rank
    of the same user could send to end or stop it are ignored (a PID namespace's init gets from
    inside only those it has a handler for, as Python's SIGINT)."""
    from grader.rerun.world import SHIELDED
    assert {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTSTP"} <= \
        {signal.Signals(s).name for s in SHIELDED}
    executor = WarmExecutor("off")
    try:
        executor.start()
        status = Path(f"/proc/{executor._proc.pid}/status").read_text()
    finally:
        executor.close()
    ignored = int(status.split("SigIgn:")[1].split()[0], 16)
    assert [signal.Signals(s).name for s in SHIELDED if not ignored >> (s - 1) & 1] == []


# ---- the smaller leaks --------------------------------------------------------------------------

def test_a_zip_that_cannot_be_unpacked_says_so_without_the_graders_scratch_path(tmp_path):
    """A member whose name the file system refuses (too long): the message names the hand-in and
    the member, never the folder the grader unpacks into."""
    data = tmp_path / "alice.zip"
    with zipfile.ZipFile(data, "w") as z:
        z.writestr("assignment4.py", "x = 1\n")
        z.writestr("d" * 300 + ".py", "x")
    dest = tmp_path / "scratch-a4-grade-xyz"
    dest.mkdir()
    limits = load_rubric().files
    with pytest.raises(HandinError) as refused:
        extract_zip(data.read_bytes(), dest, "alice.zip", limits)
    said = str(refused.value)
    assert said.startswith("alice.zip: ") and "cannot be unpacked" in said, said
    assert str(tmp_path) not in said and "scratch-a4-grade" not in said, said


def test_a_member_whose_compressed_data_is_corrupt_is_the_hand_ins_refusal(tmp_path):
    """zlib's own error (a deflate stream damaged in the middle, its header intact) names the member:
    the hand-in is invalid, never a grader error."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("assignment4.py", "x = 1\n" * 2000)
    data = bytearray(buffer.getvalue())
    start = 30 + len("assignment4.py") + 10   # past the local header, inside the compressed stream
    data[start:start + 20] = bytes(b ^ 0xFF for b in data[start:start + 20])
    with pytest.raises(HandinError, match=r"^alice\.zip: assignment4\.py cannot be unpacked \(Error -3"):
        extract_zip(bytes(data), tmp_path, "alice.zip", load_rubric().files)


def test_the_graders_own_disk_failing_is_not_the_hand_ins(tmp_path):
    """Writing a hand-in past what the grader's process may write (its RLIMIT_FSIZE, as a full disk
    would) raises the grader's own OSError, not a refusal of the student's zip."""
    with zipfile.ZipFile(tmp_path / "alice.zip", "w") as z:
        z.writestr("assignment4.py", "x = 1\n" * 20_000)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            extract_zip((tmp_path / "alice.zip").read_bytes(), tmp_path / "out", "alice.zip", load_rubric().files)
            said = "nothing"
        except BaseException as e:  # noqa: BLE001 - the parent asserts on what it was
            said = f"{type(e).__name__} {getattr(e, 'errno', '')}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    said = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    assert said == f"OSError {errno.EFBIG}", said


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_the_zygotes_command_line_does_not_name_the_kit(sandbox):
    """What any process that sees the zygote can read of it: its command line holds no path of the kit."""
    if sandbox == "auto":
        _ta_or_skip("root")
    executor = WarmExecutor(sandbox)
    try:
        executor.start()
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"grader.rerun.zygote" in line and b"bwrap" not in line.split(b"\0")[0]:
                found.append(line)
        assert found, "no zygote found"
        for line in found:
            assert str(kit.ROOT).encode() not in line, line
    finally:
        executor.close()


# ---- a batch of them ----------------------------------------------------------------------------

@pytest.fixture(scope="module", params=CONFIG_PARAMS[:2])
def failing(request, reference_run, tmp_path_factory):
    config = request.param
    ta = _ta_or_skip(config)
    try:
        yield _grade(config, ta, reference_run, tmp_path_factory)
    finally:
        if ta is not None:
            tas.remove(ta)


def _grade(config, ta, reference_run, tmp_path_factory, names=("returns_huge",) + SIGNALS, sandbox="auto") -> dict:
    tmp = ta.home / "work" if ta else tmp_path_factory.mktemp("failing")
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir(parents=True)
    (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
    handins = {"reference": Files(code=REFERENCE.read_text(), log=reference_run[0], err=reference_run[1])}
    handins.update({name: returns_huge(*reference_run) if name == "returns_huge" else build(name, {}, *reference_run)
                    for name in names})
    for name, files in handins.items():
        (inbox / f"{name}.zip").write_bytes(zip_bytes(files))
    args = ["-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "2", "--rubric",
            str(tmp / "rubric.yaml"), "--quiet", "--sandbox", sandbox]
    started = time.monotonic()
    if ta:
        subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
        proc = ta.run([str(ta.python), *args], timeout=900)
    else:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return dict(config=config, proc=proc, elapsed=time.monotonic() - started, results=results)


@pytest.mark.timeout(900)
def test_grade_calls_none_of_it_the_machines(failing):
    proc = failing["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {name: r["status"] for name, r in failing["results"].items()} == dict.fromkeys(
        ["reference", "returns_huge", *SIGNALS], "graded")


def test_the_reference_keeps_full_marks_beside_them(failing):
    r = failing["results"]["reference"]
    assert (r["status"], r["score"]) == ("graded", FULL)


def test_a_part_that_returns_too_large_a_tensor_fails_on_its_own_clock(failing):
    r = failing["results"]["returns_huge"]
    assert r["seconds"] < 60, r["seconds"]
    for part in load_rubric().part_ids:
        checks = r["parts"][part]["checks"]
        assert [c["status"] for c in checks] == ["crashed"] * len(checks), (part, checks)
        public, hidden = checks[0], checks[1]
        assert not public["hidden"] and hidden["hidden"]
        assert "the part returned a tensor of 1048576 values; it should return the weight, 64 x 32" \
            in public["message"], public["message"]
        assert "it should return the weight" in hidden["message"] and "1048576" not in hidden["message"], \
            hidden["message"]


@pytest.mark.parametrize("name", SIGNALS)
def test_a_rank_that_signals_costs_only_its_own_part(failing, name):
    attack = ATTACKS[name]
    r = failing["results"][name]
    baseline = r["parts"]["baseline"]
    assert baseline["status"] in attack.status, baseline["message"]
    assert attack.words in baseline["message"], baseline["message"]
    assert "infra" not in json.dumps(r) and "not your code" not in json.dumps(r)
    assert {p: r["parts"][p]["status"] for p in load_rubric().part_ids if p != "baseline"} == \
        dict.fromkeys([p for p in load_rubric().part_ids if p != "baseline"], "passed")


@pytest.mark.configs
@pytest.mark.timeout(900)
def test_with_the_sandbox_off_a_rank_that_stops_its_leader_loses_only_its_own_world(reference_run, tmp_path_factory):
    """An ordinary user's `--sandbox off`: no PID namespace, so a rank can signal its leader (its
    parent, of the same user). The signals it ignores do nothing; SIGSTOP stops it, and the zygote
    kills it: that hand-in's parts crash, graded, and the reference beside it keeps full marks.
    (`kill(-1, ...)` there reaches every process of the user, the grader's own: what `--sandbox off`
    accepts, docs/security.md.)"""
    ta = _ta_or_skip("user")
    try:
        graded = _grade("user", ta, reference_run, tmp_path_factory, names=("signal_the_leader",), sandbox="off")
    finally:
        tas.remove(ta)
    proc, results = graded["proc"], graded["results"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (results["reference"]["status"], results["reference"]["score"]) == ("graded", FULL)
    r = results["signal_the_leader"]
    assert r["status"] == "graded" and r["parts"]["baseline"]["status"] == "crashed", r["message"]
    assert "infra" not in json.dumps(r) and "not your code" not in json.dumps(r)
