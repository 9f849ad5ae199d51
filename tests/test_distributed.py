"""Multi-process training (docs/scale.md), as subprocesses on
CPU with gloo.

- `python train.py` (R = 1) and `torchrun --nproc_per_node=R train.py` with one config write
  byte-identical chain.jsonl files and checkpoints: R = 2, 4 on N = 4 micro-batches, also with
  --quant=int8 and over a weighted mix of corpora (each row's source is drawn by Philox from seed, step, micro-batch and
  row), and R = 3, 4, 6 on N = 12 (R = 4: blocks of 3 micro-batches, which are not subtrees of
  the step's tree);
- one process replaying a step of the R = 4 runs with the ranks simulated (treefold.simulate_ranks
  standing in for the all-reduce inside train.train_step, for every R that divides N) reaches the
  state hash the real run published;
- the reference run's shape, N = 288 on R = 48 (48 processes do not fit here), simulated the
  same way, gives the same step as R = 1;
- R = 3 on N = 4 is refused on rank 0 before any work, with the valid world sizes, and creates
  nothing;
- an error only one rank meets (a damaged chunk only rank 1 reads) is reported by that rank;
- a rank ends without the interpreter's shutdown (train.end_rank), its output flushed, even
  after --recompute has left the process group's Gloo threads alive (an atexit probe);
- a rank killed with SIGKILL makes the other ranks stop with an error in bounded time, under
  torchrun and without its agent (plain processes with the env:// variables, so train.py's own
  error path is what ends them); the chain and checkpoints left behind verify, and resuming (with
  the same or another world size) re-derives the reference chain byte for byte.

Every run uses the same --run_dir string ("run", relative to its own working directory),
although the genesis record holds only the config fields that decide the chain.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import treefold
from prepare import make_mix
from tiny import TINY, launch_env as env, make_corpus, other_kernels_env, run_process, share_secret, start_process, stop_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
MAX_STEPS = 16
CKPT_EVERY = 4
STEPS_12, CKPT_EVERY_12 = 6, 3       # the N = 12 runs: three times the work per step
WORLDS = {4: (1, 2, 4), 12: (1, 3, 4, 6)}
DIST_TIMEOUT = 20
BOUND_S = DIST_TIMEOUT + 30          # a dead rank must end the run within this many seconds
WORLD_MSG = "world size 3 is not supported"


def torchrun_cmd(nproc, *extra):
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    launcher = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    return launcher + ["--standalone", f"--nproc_per_node={nproc}", *extra, TRAIN]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=3000)


@pytest.fixture(scope="module")
def args(corpus):
    """The one config every N = 4 run uses, over a corpus built here."""
    return ["--run_dir=run", f"--data_dir={corpus}", *TINY, f"--max_steps={MAX_STEPS}", "--warmup_steps=2",
            f"--checkpoint_every={CKPT_EVERY}", "--eval_every=0", "--sample_tokens=0",
            "--threads=1", f"--dist_timeout={DIST_TIMEOUT}"]


def args_for(args, n):
    """The config of the N = n runs (later flags override earlier ones)."""
    return args if n == 4 else args + [f"--micro_batches={n}", f"--max_steps={STEPS_12}",
                                       f"--checkpoint_every={CKPT_EVERY_12}"]


def launch(cmd, cwd, environ=None):
    cwd.mkdir(parents=True, exist_ok=True)
    proc = run_process(cmd, cwd=cwd, env=environ or env(), capture_output=True, text=True, timeout=300)
    return proc


def check_ok(proc):
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def train_runs(base, args, n):
    """{R: run directory} for every R of WORLDS[n]: R = 1 with plain python, the others torchrun
    under R = 1's secret (the chain bytes depend on it through step_commit). R = 2 runs the other
    CPU kernel versions (tiny.other_kernels_env: the 256-bit matmul tile where 512 is the default)."""
    out = {}
    for world in WORLDS[n]:
        cmd = [sys.executable, TRAIN] if world == 1 else torchrun_cmd(world)
        if world > 1:
            share_secret(out[1], base / f"r{world}" / "run")
        check_ok(launch(cmd + args_for(args, n), base / f"r{world}", other_kernels_env() if world == 2 else None))
        out[world] = base / f"r{world}" / "run"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, args):
    return train_runs(tmp_path_factory.mktemp("runs"), args, 4)


@pytest.fixture(scope="module")
def runs12(tmp_path_factory, args):
    return train_runs(tmp_path_factory.mktemp("runs12"), args, 12)


def runs_of(request, n):
    return request.getfixturevalue("runs" if n == 4 else "runs12")


def chain_bytes(run):
    return (run / "chain.jsonl").read_bytes()


def checkpoint_files(run):
    import rundir
    return rundir.list_checkpoints(run / "checkpoints")


# ----------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("n", sorted(WORLDS))
def test_chain_byte_identical_across_world_sizes(request, n):
    import hashchain
    runs = runs_of(request, n)
    ref = chain_bytes(runs[1])
    chain = hashchain.Chain(runs[1] / "chain.jsonl")
    assert chain.load(repair=False) is None
    chain.verify()
    assert len(chain) == (MAX_STEPS if n == 4 else STEPS_12) + 1
    assert chain.records[0]["config"]["micro_batches"] == n
    for world in WORLDS[n][1:]:
        assert chain_bytes(runs[world]) == ref, f"R={world} chain differs from R=1"
        assert f"{world} rank(s) x {n // world} micro-batches" in (runs[world] / "train.log").read_text()


def test_chain_byte_identical_across_world_sizes_with_a_mix(args, tmp_path):
    mix = tmp_path / "mix"
    for name, seed in (("plays", 7), ("poems", 11)):
        (tmp_path / name).mkdir()
        shutil.copytree(make_corpus(tmp_path / name, seed=seed, lines=1500), mix / name)
    make_mix("plays=0.7,poems=0.3", str(mix))
    mix_args = [a for a in args if not a.startswith("--data_dir=")] + [f"--data_dir={mix}"]
    chains = {}
    for world in (1, 2, 4):
        cmd = [sys.executable, TRAIN] if world == 1 else torchrun_cmd(world)
        if world > 1:               # one secret, so one step_commit per step
            share_secret(tmp_path / "r1" / "run", tmp_path / f"r{world}" / "run")
        check_ok(launch(cmd + mix_args, tmp_path / f"r{world}"))
        chains[world] = chain_bytes(tmp_path / f"r{world}" / "run")
    assert chains[2] == chains[1] and chains[4] == chains[1]
    genesis = json.loads(chains[1].splitlines()[0])
    assert [e["name"] for e in genesis["data_mix"]] == ["plays", "poems"]
    assert set(genesis["data_splits"]) == {"plays/train", "plays/val", "poems/train", "poems/val"}


def test_chain_byte_identical_across_world_sizes_with_int8(args, tmp_path):
    """--quant=int8 (int8 GEMMs, LSQ step sizes learned and re-pinned): R = 1, 2, 4 write the
    same chain and final checkpoint bytes."""
    int8_args = args + ["--quant=int8", "--max_steps=8"]
    for world in (1, 2, 4):
        cmd = [sys.executable, TRAIN] if world == 1 else torchrun_cmd(world)
        if world > 1:
            share_secret(tmp_path / "r1" / "run", tmp_path / f"r{world}" / "run")
        check_ok(launch(cmd + int8_args, tmp_path / f"r{world}"))
    runs = {world: tmp_path / f"r{world}" / "run" for world in (1, 2, 4)}
    assert json.loads(chain_bytes(runs[1]).splitlines()[0])["config"]["quant"] == "int8"
    for world in (2, 4):
        assert chain_bytes(runs[world]) == chain_bytes(runs[1]), f"R={world} int8 chain differs from R=1"
        assert [p.read_bytes() for _, p in checkpoint_files(runs[world])] == \
               [p.read_bytes() for _, p in checkpoint_files(runs[1])]


@pytest.mark.parametrize("n", sorted(WORLDS))
def test_checkpoints_byte_identical_across_world_sizes(request, n):
    runs = runs_of(request, n)
    steps, every = (MAX_STEPS, CKPT_EVERY) if n == 4 else (STEPS_12, CKPT_EVERY_12)
    ref = checkpoint_files(runs[1])
    assert [s for s, _ in ref] == list(range(0, steps + 1, every))
    for world in WORLDS[n][1:]:
        got = checkpoint_files(runs[world])
        assert [s for s, _ in got] == [s for s, _ in ref]
        for (step, a), (_, b) in zip(ref, got):
            assert a.read_bytes() == b.read_bytes(), f"R={world} checkpoint of step {step} differs"


def simulate_allreduce(monkeypatch, leaf, n, world, rank):
    """Make train_step's all-reduce treefold.simulate_ranks: one device plays every rank."""
    import treefold

    def simulated_allreduce(fold):
        # train_step folded rank `rank`'s block itself, into its frontier
        assert (fold.n, fold.leaves, fold.next) == (n, treefold.block(n, world, rank), fold.leaves.stop)
        assert len(fold.frontier) == len(treefold.frontier(n, fold.leaves))
        return treefold.simulate_ranks(leaf, n, world)

    monkeypatch.setattr(treefold, "allreduce", simulated_allreduce)


@pytest.mark.parametrize("n", sorted(WORLDS))
def test_simulated_ranks_match_the_real_run(request, n, monkeypatch):
    """Replay step k+1 of the R = 4 run in this process: train_step with the all-reduce replaced
    by treefold.simulate_ranks for every R that divides N must publish the same record."""
    import hashchain
    import receipts
    import rundir
    import train
    from data import TokenData

    run = runs_of(request, n)[4]
    opened = rundir.Run(run)
    opened.chain.verify()
    chain, cfg = opened.chain, opened.cfg
    data = TokenData(opened.recorded_data_dir(), cfg.seed)  # not in the chain: config.json
    k = 2 * CKPT_EVERY if n == 4 else CKPT_EVERY_12
    tensors = opened.verified_checkpoint(k, rundir.checkpoint_path(run / "checkpoints", k))
    assert cfg.micro_batches == n

    for world in (w for w in range(1, n + 1) if n % w == 0):
        state = train.TrainState(cfg, data.vocab_size)
        state.load(tensors)
        assert state.hash()[0] == chain.records[k]["state_hash"]

        def leaf(m):
            return train.micro_batch_gradient(state, data, cfg, k + 1, m)

        simulate_allreduce(monkeypatch, leaf, n, world, world - 1)
        fields = train.train_step(state, data, cfg, rank=world - 1, world=world)
        # the trainer's result_root: the post-step state keyed by the step's grad_root
        result_root = hashchain.keyed_state_root(fields["grad_root"].result(), state.tensors())
        record = train.step_record(state.step, state.hash()[0], data, cfg, fields, chain.records[0]["record_hash"],
                                   receipts.read_secret(run, ""), result_root)
        published = chain.records[k + 1]
        assert record["state_hash"] == published["state_hash"], f"simulated R={world}"
        assert ({**record, "prev": published["prev"], "record_hash": published["record_hash"]}
                == published)


def test_reference_run_shape_288_on_48_ranks_simulated(corpus, monkeypatch):
    """N = 288 micro-batches on R = 48 ranks (blocks of 6, not subtrees: each rank sends two
    partial sums), the ranks simulated in this process as seen from the last rank, gives the
    same step as R = 1. What differs between the two is the tree's partition across ranks, so
    each micro-batch's gradient is computed once (R = 1) and handed out again as a copy (the
    fold adds into its inputs) to the 48 ranks: the same leaves, another tree."""
    import config
    import train
    from data import TokenData

    n, world = 288, 48
    cfg = config.parse_config([f"--data_dir={corpus}", *TINY, f"--micro_batches={n}", "--micro_batch_size=1"])
    data = TokenData(cfg.data_dir, cfg.seed)
    computed, gradient = {}, train.micro_batch_gradient

    def once(state, data, cfg, step, micro, witness=None):
        if micro not in computed:
            computed[micro] = gradient(state, data, cfg, step, micro, witness).clone()
        return computed[micro].clone()

    monkeypatch.setattr(train, "micro_batch_gradient", once)
    records = []
    for ranks in (1, world):
        state = train.TrainState(cfg, data.vocab_size)

        def leaf(m):
            return train.micro_batch_gradient(state, data, cfg, 1, m)

        simulate_allreduce(monkeypatch, leaf, n, ranks, ranks - 1)
        fields = train.train_step(state, data, cfg, rank=ranks - 1, world=ranks)
        records.append(train.step_record(state.step, state.hash()[0], data, cfg, fields, "0" * 64))
    assert len(computed) == n and records[1] == records[0]


# ----------------------------------------------------------------------------- invalid R
def test_invalid_world_size_refused_before_any_work(tmp_path, args):
    logs = tmp_path / "logs"
    proc = launch(torchrun_cmd(3, f"--log-dir={logs}", "--redirects=3") + args, tmp_path / "w")
    assert proc.returncode != 0
    stderr = {int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_0/*/stderr.log")}
    assert sorted(stderr) == [0, 1, 2]
    assert re.search(r"world size 3 is not supported: it must divide micro_batches=4 \(1, 2, 4\)",
                     stderr[0]), stderr[0]
    assert stderr[0].count(WORLD_MSG) == 1
    assert WORLD_MSG not in stderr[1] + stderr[2]           # printed once, by rank 0
    assert "Traceback" not in "".join(stderr.values())
    assert not (tmp_path / "w" / "run").exists()            # nothing was created
    # positive control: 3 ranks pass the same check where they divide micro_batches, and the
    # same args train with R = 1, 2, 4 (test_chain_byte_identical_across_world_sizes)
    treefold.check_topology(6, 3)
    treefold.check_topology(4, 2)


# ----------------------------------------------------------------------------- a rank's end
SHUTDOWN_PROBE = """import atexit, os, sys
atexit.register(lambda: print("interpreter shutdown: rank " + os.environ.get("RANK", "-"), file=sys.stderr))
"""


def test_ranks_end_without_interpreter_shutdown(tmp_path, args):
    """A rank ends through train.end_rank (os._exit) once its output is flushed: the interpreter's
    shutdown, where the process group's Gloo threads (kept alive by torch after --recompute's
    first checkpoint) aborted a rank now and then, never runs. A sitecustomize.py on PYTHONPATH
    prints a marker from an atexit handler, which only a shutdown runs: R = 1 prints it (the
    probe works), the ranks of R = 2 do not, and everything they log arrives. Ranks that stop
    before joining the group (R = 3 on N = 4, refused by every rank) exit the ordinary way, so
    that rank 0's report is out before torchrun stops it: those that end on their own run the
    shutdown."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(SHUTDOWN_PROBE)
    environ = env()
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path / "probe"), environ.get("PYTHONPATH")]))
    steps = ["--max_steps=2", "--recompute=1"]
    one = launch([sys.executable, TRAIN] + args + steps, tmp_path / "r1", environ)
    check_ok(one)
    assert "interpreter shutdown: rank -" in one.stderr
    share_secret(tmp_path / "r1" / "run", tmp_path / "r2" / "run")
    two = launch(torchrun_cmd(2) + args + steps, tmp_path / "r2", environ)
    check_ok(two)
    assert not re.search(r"interpreter shutdown: rank \d", two.stderr), two.stderr[-2000:]
    assert re.search(r"audit a step: \S*python audit.py --run_dir run --step 1 ", two.stdout), two.stdout
    assert chain_bytes(tmp_path / "r2" / "run") == chain_bytes(tmp_path / "r1" / "run")
    three = launch(torchrun_cmd(3) + args + steps, tmp_path / "r3", environ)
    assert three.returncode != 0 and WORLD_MSG in three.stderr
    assert re.search(r"interpreter shutdown: rank \d", three.stderr), three.stderr[-2000:]


def test_an_error_only_one_rank_meets_is_reported_by_it(tmp_path, args):
    """After joining the group a rank reports its own error: a train chunk that only rank 1 reads
    in step 1 (R = 2, its micro-batches 2 and 3), changed by one byte, gives rank 1's line naming
    the chunk, whatever becomes of rank 0 (left waiting in the all-reduce). The unchanged corpus
    trains (positive control: the same command with the clean copy)."""
    import data
    (tmp_path / "corpus").mkdir()
    corpus = make_corpus(tmp_path / "corpus", seed=7, lines=3000, chunk_bytes=1024)
    tokens = data.TokenData(str(corpus), seed=0)        # the runs' --seed=0: their data order
    seq_len, batch = 16, 2                               # TINY's
    chunk_tokens = tokens.tokens["train"].chunk_tokens

    def chunks_read(micros):
        return {k for m in micros for _, o in tokens.rows("train", 1, m, batch, seq_len)
                for k in range(o // chunk_tokens, (o + seq_len) // chunk_tokens + 1)}
    only_rank1 = sorted(chunks_read(treefold.block(4, 2, 1)) - chunks_read(treefold.block(4, 2, 0)))
    assert only_rank1, "no train chunk that only rank 1 reads in step 1"
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    raw = bytearray((bad / "train.bin").read_bytes())
    raw[only_rank1[0] * 1024] ^= 0x01
    (bad / "train.bin").write_bytes(bytes(raw))
    argv = [a for a in args if not a.startswith("--data_dir=")] + ["--max_steps=1", "--seed=0"]
    proc = launch(torchrun_cmd(2) + argv + [f"--data_dir={bad}"], tmp_path / "w")
    assert proc.returncode != 0
    assert re.search(rf"train.py: error \(rank 1\): split 'train': chunk {only_rank1[0]} of .* does not match",
                     proc.stderr), proc.stderr[-3000:]
    check_ok(launch(torchrun_cmd(2) + argv + [f"--data_dir={corpus}"], tmp_path / "clean"))


# ----------------------------------------------------------------------------- dead rank
def _proc_table():
    """{pid: (ppid, state)} from /proc."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(d)] = (int(fields[1]), fields[0])
    return table


def _alive(pid):
    state = _proc_table().get(pid)
    return state is not None and state[1] not in ("Z", "X")


def _rank_pids(root_pid, world, deadline):
    """{rank: pid} of root_pid's descendants running train.py, read from their environment."""
    while time.monotonic() < deadline:
        table, found = _proc_table(), {}
        kids = {root_pid}
        for _ in range(4):
            kids |= {p for p, (pp, _) in table.items() if pp in kids}
        for pid in kids - {root_pid}:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().split(b"\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if not any(a.endswith(b"train.py") for a in cmdline):
                continue
            ranks = [e[5:] for e in environ if e.startswith(b"RANK=")]
            if ranks:
                found[int(ranks[0])] = pid
        if len(found) == world:
            return found
        time.sleep(0.05)
    raise AssertionError(f"did not find {world} train.py ranks under pid {root_pid}")


def _wait_for_steps(chain_path, n_lines, procs, deadline):
    while time.monotonic() < deadline:
        if chain_path.exists() and chain_path.read_bytes().count(b"\n") >= n_lines:
            return
        for p in procs:
            assert p.poll() is None, f"a process exited early (rc {p.returncode})"
        time.sleep(0.005)
    raise AssertionError(f"{chain_path} did not reach {n_lines} lines")


def _kill_rank_mid_run(victim, chain_path):
    """Freeze the victim first (the run cannot then finish), check the run is mid-way, SIGKILL."""
    os.kill(victim, signal.SIGSTOP)
    lines = chain_path.read_bytes().count(b"\n")
    assert lines < MAX_STEPS + 1, "the run finished before the rank could be killed"
    os.kill(victim, signal.SIGKILL)
    return time.monotonic()


def _check_left_behind(run, reference):
    """The chain and checkpoints left by a killed run: nothing torn or unverifiable."""
    import rundir
    opened = rundir.Run(run, writer=True)     # as the next trainer would: cut a torn tail
    chain, note = opened.chain, opened.chain.note
    chain.verify()
    data = (run / "chain.jsonl").read_bytes()
    assert data.endswith(b"\n") and len(chain) == data.count(b"\n")
    assert reference.startswith(data), "the partial chain is not a prefix of the reference chain"
    rundir.remove_temp_files(run / "checkpoints")   # as the next lock holder would
    ckpts = checkpoint_files(run)
    assert ckpts and ckpts[0][0] == 0
    for step, path in ckpts:
        assert step < len(chain), f"checkpoint of step {step} without its chain record"
        opened.verified_checkpoint(step, path)
    # nothing else in the directory could pass for a checkpoint
    assert sorted(os.listdir(run / "checkpoints")) == sorted(p.name for _, p in ckpts)
    return len(chain), note


def _cleanup(pids):
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_dead_rank_torchrun_stops_and_resumes(tmp_path, args, runs):
    world, victim_rank = 4, 1
    cwd = tmp_path / "dead4"
    share_secret(runs[1], cwd / "run")
    chain_path = cwd / "run" / "chain.jsonl"
    cmd = torchrun_cmd(world) + args
    with open(cwd / "out.txt", "w") as out:
        proc = start_process(cmd, cwd=cwd, env=env(), stdout=out, stderr=subprocess.STDOUT)
    pids = {}
    try:
        deadline = time.monotonic() + 180
        pids = _rank_pids(proc.pid, world, deadline)
        _wait_for_steps(chain_path, 2 * CKPT_EVERY - 1, [proc], deadline)
        t_kill = _kill_rank_mid_run(pids[victim_rank], chain_path)
        rc = proc.wait(timeout=BOUND_S)
        elapsed = time.monotonic() - t_kill
        assert rc != 0
        while any(_alive(p) for p in pids.values()) and time.monotonic() - t_kill < BOUND_S:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids.values()), "a rank outlived torchrun"
        print(f"\n[dead rank, torchrun R={world}] torchrun exited rc={rc} "
              f"{elapsed:.2f}s after SIGKILL of rank {victim_rank}")
    finally:
        stop_process(proc)           # torchrun and its ranks: one process group
        _cleanup(pids.values())
    output = (cwd / "out.txt").read_text()
    assert "train.py FAILED" in output or "ChildFailedError" in output, output[-3000:]
    reference = chain_bytes(runs[1])
    steps_left, _ = _check_left_behind(cwd / "run", reference)
    assert steps_left >= 2 * CKPT_EVERY - 1

    # the same command again: resumes from the last checkpoint and completes the reference chain
    check_ok(launch(cmd, cwd))
    assert chain_bytes(cwd / "run") == reference
    last = last_checkpoint(cwd / "run")
    assert last.read_bytes() == last_checkpoint(runs[1]).read_bytes()
    assert "resume: from step" in (cwd / "run" / "train.log").read_text()


def last_checkpoint(run):
    ckpts = checkpoint_files(run)
    assert ckpts[-1][0] == MAX_STEPS
    return ckpts[-1][1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_rank_without_agent_stops_and_resumes(tmp_path, args, runs):
    """No torchrun agent to kill the survivor: train.py itself must notice the dead peer."""
    world, victim_rank = 2, 1
    cwd = tmp_path / "dead2"
    share_secret(runs[1], cwd / "run")
    chain_path = cwd / "run" / "chain.jsonl"
    port = _free_port()
    procs, errs = [], []
    try:
        for rank in range(world):
            e = dict(env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                     RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
            errs.append(cwd / f"rank{rank}.err")
            with open(errs[-1], "w") as err:
                procs.append(start_process([sys.executable, TRAIN] + args, cwd=cwd, env=e,
                                           stdout=subprocess.DEVNULL, stderr=err))
        _wait_for_steps(chain_path, 2 * CKPT_EVERY - 1, procs, time.monotonic() + 180)
        t_kill = _kill_rank_mid_run(procs[victim_rank].pid, chain_path)
        rc = procs[0].wait(timeout=BOUND_S)
        elapsed = time.monotonic() - t_kill
        print(f"\n[dead rank, no agent R={world}] rank 0 exited rc={rc} "
              f"{elapsed:.2f}s after SIGKILL of rank {victim_rank}")
    finally:
        for p in procs:
            stop_process(p)
    err0 = errs[0].read_text()
    assert rc == 1, err0[-3000:]
    assert "train.py: error (rank 0):" in err0, err0[-3000:]
    assert "Traceback" not in err0
    assert elapsed < BOUND_S
    reference = chain_bytes(runs[1])
    _check_left_behind(cwd / "run", reference)

    # resume on a different world size (plain python, R = 1): same chain, byte for byte
    check_ok(launch([sys.executable, TRAIN] + args, cwd))
    assert chain_bytes(cwd / "run") == reference
    assert last_checkpoint(cwd / "run").read_bytes() == last_checkpoint(runs[1]).read_bytes()
