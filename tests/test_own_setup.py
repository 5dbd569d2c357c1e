"""Hand-ins shaped as the scripts they are: the process group set up (and torn down) by the code itself,
the script's set-up at its top level, as torchrun runs it.

A world's ranks join gloo before any hand-in code runs (grader.rerun.rank.worker), so such code must
find the group up and keep it: the handout's `init_distributed`, written into assignment4.py rather
than utils.py and called at the top of the script, runs at load (grader.rerun.rank.source keeps an
assignment that only sets up the group), and `init_process_group` / `destroy_process_group` called
inside a part leave the world's group as it is (grader.rerun.rank.hooks.keep_the_world). Each of
these passed on a cluster, and crashed every part here before ("trying to initialize the default
process group twice", or `world_size` not defined at load). So did a script's other set-up at its
top: a wrapper of its own around init_distributed, a config object of a class of its own, a device
chosen in an `if`, arguments read with argparse (a rank's command line is the script's alone).
"""

import ast
import dataclasses

import pytest

from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.rank.source import script_statements_removed
from grader.results import Status
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, fast_rubric

PARTS = ["baseline", "grad_accumulation", "data_parallel", "tensor_parallel"]

# The handout's own init_distributed (its [1/6] step 3), NCCL and all, in the hand-in's file.
OWN_INIT = '''
def init_distributed():
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    print(f"[Distributed Init] Rank {rank} initialized on GPU {local_rank}.")
    dist.barrier()
    return rank, local_rank, world_size


rank, local_rank, world_size = init_distributed()
local_batch_size = 128 // world_size
'''

DP = "def data_parallel_single_step(seed=42, device=None):\n"
TP = "def full_column_parallel_single_step(seed=42, device=None):\n"
STEP_END = "    optimizer.step()\n    return model.W.detach()\n"
OWN_GROUP = "    dist.init_process_group(backend='gloo')\n"


# A script's set-up, each line of which a hand-in on a cluster had at its top level.
SCRIPT_SETUP = '''
import argparse
from dataclasses import dataclass


@dataclass
class TrainConfig:
    lr: float = learning_rate


def setup():
    return init_distributed()


class Runner:
    def run_all(self):
        return single_step()


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()
cfg = TrainConfig()
rank, local_rank, world_size = setup()
if torch.cuda.is_available():
    DEVICE = torch.device("cuda", local_rank)
    print("on", DEVICE)
else:
    DEVICE = torch.device("cpu")
try:
    import numpy
except ImportError:
    numpy = None
    print("no numpy")
runner = Runner()
both = runner.run_all()
dist.broadcast(both, src=0)
torch.manual_seed(0)
if __name__ == "__main__":
    print(single_step())
'''


def script_setup() -> str:
    """The reference with SCRIPT_SETUP at its top (the handout's init_distributed from utils), its
    Part 1 stepping at cfg.lr and its Part 4 gathering onto DEVICE."""
    text = REFERENCE.read_text()
    assert "\nfrom utils import" in text and text.count("lr=learning_rate") >= 1
    text = text.replace("\nfrom utils import", "\nfrom utils import init_distributed\nfrom utils import", 1)
    top = text.index("\ndef ", text.index("\nfrom utils import"))
    text = text[:top] + SCRIPT_SETUP + text[top:]
    first = text.index("lr=learning_rate")
    text = text[:first] + "lr=cfg.lr" + text[first + len("lr=learning_rate"):]
    gather = "    dist.all_gather(weight_shards, local_updated_weight)"
    assert text.count(gather) == 1
    return text.replace(gather, gather + "\n    weight_shards = [w.to(DEVICE) for w in weight_shards]")


def own_init_at_load() -> str:
    text = REFERENCE.read_text()
    assert "\nimport os\n" in text, "the reference no longer imports os"
    return text + OWN_INIT + "print(local_batch_size)\nweight = single_step()\n"


def own_group_in_each_part() -> str:
    """Parts 3 and 4 each set up the group first; Part 3 destroys it at its end."""
    text = REFERENCE.read_text()
    for old, new in ((DP, DP + OWN_GROUP), (TP, TP + OWN_GROUP)):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    start = text.index(DP)
    end = text.index(STEP_END, start) + len(STEP_END)
    ending = "    optimizer.step()\n    weight = model.W.detach()\n    dist.destroy_process_group()\n    return weight\n"
    return text[:end - len(STEP_END)] + ending + text[end:]


def test_an_assignment_that_only_sets_up_the_group_is_kept_and_one_that_runs_a_part_is_not():
    tree = ast.parse(own_init_at_load() + "def run_all():\n    return init_distributed(), single_step()\n\n"
                                          "both = run_all()\n")
    kept_before = {n.lineno for n in tree.body}
    dropped = script_statements_removed(tree)
    source = own_init_at_load().splitlines()
    said = {source[line - 1] for line in dropped if line <= len(source)}
    assert "rank, local_rank, world_size = init_distributed()" not in said
    assert {"print(local_batch_size)", "weight = single_step()"} <= said
    assert max(dropped) > len(source)   # both = run_all(): it runs a part, through a function of its own
    assert len(tree.body) == len(kept_before) - len(dropped)


def test_a_scripts_setup_is_kept_and_what_runs_a_part_or_prints_is_not():
    tree = ast.parse(script_setup())
    lines = script_setup().splitlines()
    said = {lines[line - 1].strip() for line in script_statements_removed(tree)}
    assert said == {'print("on", DEVICE)', 'print("no numpy")', "both = runner.run_all()", 'if __name__ == "__main__":',
                    "dist.broadcast(both, src=0)"}   # what a part made, left out with it
    kept = ast.unparse(tree)
    for line in ("torch.manual_seed(0)", "parser.add_argument('--steps', type=int, default=1)", "args = parser.parse_args()", "runner = Runner()",
                 "cfg = TrainConfig()", "rank, local_rank, world_size = setup()",
                 "DEVICE = torch.device('cpu')", "numpy = None"):
        assert line in kept, line


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own-setup")
    rubric = load_rubric(fast_rubric(tmp))
    check = dataclasses.replace(next(c for c in rubric.checks if c.name == "default"), world_size=2)
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    yield executor, rubric, check, tmp
    executor.close()


@pytest.mark.parametrize("name, text", [("own-init-at-load", own_init_at_load()),
                                        ("own-group-in-each-part", own_group_in_each_part()),
                                        ("script-setup", script_setup())])
def test_code_that_sets_up_its_own_group_passes_every_part(world, name, text):
    executor, rubric, check, tmp = world
    path = tmp / f"{name}.py"
    path.write_text(text)
    runs = run_check(executor, prepare_code(path), check, rubric, tmp, PARTS)
    assert {p: r.status for p, r in runs.items()} == {p: Status.PASSED for p in PARTS}, \
        {p: (r.detail, [x.exception for x in r.ranks.values()]) for p, r in runs.items()}


def test_a_part_reading_what_only_the_script_binds_is_told_the_line_left_out(world):
    """Part 2 reads `W`, which only the script's own `W = single_step()` binds: the NameError the
    rank raises points to that line, the one the grader leaves out (inside the `__name__` guard too)."""
    executor, rubric, check, tmp = world
    text = REFERENCE.read_text()
    head = "def single_step_with_grad_accumulation("
    assert text.count(head) == 1
    start = text.index(":\n", text.index(head)) + 2
    text = text[:start] + "    W.sum()\n" + text[start:]
    for name, script in (("top", "W = single_step()\n"),
                         ("guard", 'if __name__ == "__main__":\n    print("start")\n    W = single_step()\n')):
        path = tmp / f"reads-{name}.py"
        path.write_text(text + script)
        line = len(text.splitlines()) + script.count("\n")
        run = run_check(executor, prepare_code(path), check, rubric, tmp, ["grad_accumulation"])["grad_accumulation"]
        assert run.status == Status.CRASHED
        said = {r.exception for r in run.ranks.values()}
        assert said == {f"NameError: name 'W' is not defined (assignment4.py binds W only at line {line}, in the "
                        f"script's own statements, which the grader does not run: each part is called on its own, "
                        f"after the file's imports, definitions and set-up)"}, said
