"""Hand-ins for the integrity report (tests/test_integrity.py) and its benchmark
(benchmarks/integrity_pairs.py): correct solutions of the TODO lines written independently, in
different styles; the ways a copier hides a copy; runs' logs; and the grading.json `grade` writes.

`fill(style)` writes a style's answers into the generated skeleton, each at the indentation of the
TODO it replaces (and its helper functions before Part 1), so every hand-in keeps the skeleton
exactly as a student receives it. `disguise(code, names)` is what a copier does: rename variables
and run the file through a formatter (ast.unparse), which drops every comment.
"""

import ast
import functools
import hashlib
import random
import textwrap

from grader import kit
from grader.evidence.logfile import parse_log
from grader.instructor.skeleton import _BEGIN, _END, _SCOPE
from grader.parts import PART_IDS
from grader.results import CheckOutcome, PartResult, Status, new_result
from grader.rubric import load_rubric

PREFIXES = ("Baseline", "GradAccumulation", "DataParallel", "FullColumnParallel")

# The skeleton's TODOs, by the start of their NotImplementedError message ("TODO in <where>: <what>").
TODOS = {
    "batch": "single_step: inputs, targets",
    "forward": "single_step: outputs",
    "loss": "single_step: loss",
    "step": "single_step: zero the gradients",
    "slice": "single_step_with_grad_accumulation: start_idx",
    "micro": "single_step_with_grad_accumulation: micro_outputs",
    "scale": "single_step_with_grad_accumulation: scaled_loss",
    "allreduce": "data_parallel_single_step: the collective",
    "f": "FullColumnParallelLinear.forward: X =",
    "g": "FullColumnParallelLinear.forward: out =",
    "shards": "full_column_parallel_single_step: weight_shards",
    # Part 5 (optional): every style writes the reference's answers.
    "reduce": "ReduceParallel.forward: summed",
    "reduce_backward": "ReduceParallel.backward: return",
    "mlp_f": "ColumnParallelLinear.forward: X =",
    "rows": "RowParallelLinear.__init__: start",
    "partial": "RowParallelLinear.forward: partial",
    "block": "MegatronMLP.forward: out =",
    "w2": "megatron_mlp_single_step: updated_w2",
}

# The answers of the reference, which most students write (the integrity report's base).
REFERENCE = {
    "batch": "inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)",
    "forward": "outputs = model(inputs)",
    "loss": "loss = loss_fn(outputs, targets)",
    "step": "optimizer.zero_grad()\nloss.backward()\noptimizer.step()",
    "slice": "start_idx = i * micro_batch_size\nend_idx = start_idx + micro_batch_size",
    "micro": "micro_outputs = model(micro_inputs)\nmicro_loss = loss_fn(micro_outputs, micro_targets)",
    "scale": "scaled_loss = micro_loss / accumulation_steps",
    "allreduce": "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
    "f": "X = BroadcastParallel.apply(X)",
    "g": "out = GatherParallel.apply(local_out)",
    "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]",
    "reduce": "summed = x.contiguous().clone()\ndist.all_reduce(summed, op=dist.ReduceOp.SUM)",
    "reduce_backward": "return grad_output",
    "mlp_f": "X = CopyToModelParallelRegion.apply(X)",
    "rows": "start = rank * self.local_in_dim\nend = start + self.local_in_dim",
    "partial": ('partial = torch.einsum("bi,ij->bj", H_local, self.W).contiguous()\n'
                "out = ReduceFromModelParallelRegion.apply(partial)"),
    "block": "out = self.fc2(nn.functional.gelu(self.fc1(X)))",
    "w2": "updated_w2 = torch.cat(w2_shards, dim=0)",
}

# Six students, six styles. Each answer is correct; each style's own lines are its own.
STYLES = {
    "terse": {
        "batch": "inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed, device)",
        "forward": "outputs = model.forward(inputs)",
        "loss": "loss = ((outputs - targets) ** 2).mean()",
        "step": "model.zero_grad(); loss.backward(); optimizer.step()",
        "slice": "start_idx, end_idx = i * micro_batch_size, (i + 1) * micro_batch_size",
        "micro": "micro_outputs = micro_inputs @ model.W\nmicro_loss = ((micro_outputs - micro_targets) ** 2).mean()",
        "scale": "scaled_loss = micro_loss * (1.0 / accumulation_steps)",
        "allreduce": "dist.all_reduce(param.grad.data)",
        "shards": "weight_shards = [torch.zeros_like(local_updated_weight) for _ in range(world_size)]",
    },
    "functional": {
        "helpers": '''
            import torch.nn.functional as F


            def _mse(prediction, target):
                """The mean squared error over every element, as nn.MSELoss(reduction="mean")."""
                return F.mse_loss(prediction, target, reduction="mean")
            ''',
        "batch": "batch = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)\n"
                 "inputs, targets = batch",
        "loss": "loss = _mse(outputs, targets)",
        "step": "optimizer.zero_grad(set_to_none=True)\nloss.backward()\noptimizer.step()",
        "slice": "start_idx = micro_batch_size * i\nend_idx = micro_batch_size * (i + 1)",
        "micro": "micro_outputs = model(micro_inputs)\nmicro_loss = _mse(micro_outputs, micro_targets)",
        "scale": "scaled_loss = micro_loss / float(accumulation_steps)",
        "allreduce": "dist.all_reduce(tensor=param.grad, op=dist.ReduceOp.SUM)",
        "shards": "weight_shards = list(torch.empty_like(local_updated_weight) for _ in range(world_size))",
    },
    "loops": {
        "forward": "outputs = torch.matmul(inputs, model.W)",
        "step": "for p in model.parameters():\n    p.grad = None\nloss.backward()\noptimizer.step()",
        "slice": "start_idx = i * micro_batch_size\nend_idx = min(start_idx + micro_batch_size, global_batch_size)",
        "scale": "scaled_loss = torch.div(micro_loss, accumulation_steps)",
        "allreduce": "work = dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True)\nwork.wait()",
        "shards": "weight_shards = []\nfor _ in range(world_size):\n    weight_shards.append(torch.empty_like(local_updated_weight))",
    },
    "defensive": {
        "batch": "# The same seed on every rank gives every rank the same batch.\n"
                 "data = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)\n"
                 "assert len(data) == 2, 'create_batch returns the inputs and the targets'\n"
                 "inputs, targets = data[0], data[1]",
        "loss": "loss = loss_fn(input=outputs, target=targets)",
        "step": "optimizer.zero_grad()\nloss.backward()\n"
                "assert model.W.grad is not None, 'backward() must fill the gradient'\noptimizer.step()",
        "slice": "start_idx = i * micro_batch_size\nend_idx = (i + 1) * micro_batch_size\n"
                 "assert end_idx <= global_batch_size, (end_idx, global_batch_size)",
        "allreduce": "grad = param.grad\ndist.all_reduce(grad, op=dist.ReduceOp.SUM)  # in place: grad is param.grad",
        "shards": "weight_shards = [torch.empty(local_updated_weight.shape, dtype=local_updated_weight.dtype,\n"
                  "                             device=local_updated_weight.device) for _ in range(world_size)]",
    },
    "einsum": {
        "batch": "inputs, targets = create_batch(batch_size=global_batch_size, input_dim=input_dim,\n"
                 "                               output_dim=output_dim, seed=seed, device=device)",
        "forward": 'outputs = torch.einsum("bi,ij->bj", inputs, model.W)',
        "loss": "loss = nn.MSELoss()(outputs, targets)",
        "slice": "start_idx = i * global_batch_size // accumulation_steps\n"
                 "end_idx = (i + 1) * global_batch_size // accumulation_steps",
        "micro": "micro_outputs = model(micro_inputs)\n"
                 "micro_loss = nn.functional.mse_loss(micro_outputs, micro_targets)",
        "scale": "scaled_loss = micro_loss.div(accumulation_steps)",
        "allreduce": "dist.all_reduce(param.grad, dist.ReduceOp.SUM)",
        "shards": "weight_shards = [local_updated_weight.clone() for _ in range(world_size)]",
    },
    "helper": {
        "helpers": '''
            def take_step(optimizer, loss):
                """Zero the gradients, backpropagate `loss`, and take the optimizer's step."""
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            ''',
        "step": "take_step(optimizer, loss)",
        "allreduce": "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dist.group.WORLD)",
        "shards": "weight_shards = [torch.empty_like(local_updated_weight) for r in range(world_size)]",
    },
}

# What a copier renames (every local name of the TODO answers and around them).
RENAMES = {"inputs": "xb", "targets": "yb", "outputs": "preds", "loss": "objective", "model": "net",
           "optimizer": "opt", "micro_inputs": "mx", "micro_targets": "my", "micro_outputs": "mpred",
           "micro_loss": "mobj", "scaled_loss": "mscaled", "start_idx": "lo", "end_idx": "hi", "param": "p_",
           "weight_shards": "pieces", "local_updated_weight": "mine", "data": "pair", "grad": "g_", "work": "handle",
           "p": "q", "batch": "bt", "i": "step_i"}


@functools.cache
def reference_answers() -> dict:
    """The reference's answer to each TODO of the skeleton, by the TODO's message ("<qualname>:
    <what>", as grader.instructor.skeleton writes it), dedented."""
    answers, scopes, todo, body = {}, [], None, []
    for line in kit.REFERENCE.read_text().splitlines(keepends=True):
        if todo is not None:
            if _END.match(line):
                answers[todo] = textwrap.dedent("".join(body)).rstrip("\n")
                todo, body = None, []
            else:
                body.append(line)
            continue
        scope = _SCOPE.match(line)
        if scope:
            indent = len(scope["indent"])
            scopes = [s for s in scopes if s[0] < indent] + [(indent, scope["name"])]
        begin = _BEGIN.match(line)
        if begin:
            todo = f"{'.'.join(name for _, name in scopes) or '<module>'}: {begin['todo']}"
    return answers


def fill(answers: dict, skeleton: str = None) -> str:
    """The skeleton with `answers` (TODO key -> code; the reference's where a key is missing, the
    TODO as it is where the code is None)."""
    text = skeleton if skeleton is not None else kit.SKELETON.read_text()
    lines, out = text.splitlines(keepends=True), []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("# TODO:"):
            continue
        if stripped.startswith("raise NotImplementedError(") and "TODO in " in stripped:
            indent = line[:len(line) - len(line.lstrip())]
            said = ast.literal_eval(stripped[len("raise NotImplementedError("):-1])[len("TODO in "):]
            key = next((k for k, where in TODOS.items() if said.startswith(where)), None)
            # A TODO of a part the styles do not write (the optional parts after Part 5): every style
            # writes the reference's own answer.
            code = answers.get(key, REFERENCE[key]) if key else reference_answers()[said]
            if code is None:   # the TODO left undone
                out.append(line)
                continue
            out += [indent + c + "\n" if c.strip() else "\n" for c in code.splitlines()]
            continue
        if stripped.startswith("### Part 1") and answers.get("helpers"):
            out.append(textwrap.dedent(answers["helpers"]).strip("\n") + "\n\n\n")
        out.append(line)
    return "".join(out)


class _Rename(ast.NodeTransformer):
    def __init__(self, names):
        self.names = names

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node


def disguise(code: str, names: dict = RENAMES) -> str:
    """`code` with its variables renamed and reformatted by ast.unparse: no comment survives, and
    every line is laid out anew."""
    return ast.unparse(_Rename(names).visit(ast.parse(code))) + "\n"


def run_log(code: str, seed: int) -> str:
    """The .log of a 4-node run of `code`: its job header, and its ranks' lines in an order of its own."""
    rng = random.Random(seed)
    sha = hashlib.sha256(code.encode()).hexdigest()
    started = f"2026-11-{10 + seed % 18:02d}T{seed % 24:02d}:{seed % 60:02d}:{(seed * 7) % 60:02d}Z"
    lines = [f"[Job] id={48000 + seed} name=assignment4 started={started}",
             "[Job] nodes=node[1-4] nnodes=4 nproc_per_node=1 world_size=4 backend=nccl",
             "[Job] torch=2.13.0+cu128 nccl=2.27.5 python=3.11.7"]
    lines += [f"{r}: [Distributed Init] Rank {r} initialized on node {r} (node{r + 1}) on cuda:0 | backend nccl | "
              f"world size 4 | torch 2.13.0+cu128 | code sha256 {sha}" for r in rng.sample(range(4), 4)]
    for prefix in PREFIXES:
        lines += [f"{r}: [{prefix}][Rank {r}] Tensors match: True | Max diff: 2.384186e-07 | Mean diff: 5.487237e-09"
                  for r in rng.sample(range(4), 4)]
    lines += [f"{r}: [Rank {r}] done" for r in rng.sample(range(4), 4)] + [f"[Job] finished status=0 at={started}"]
    return "\n".join(lines) + "\n"


def run_err(seed: int) -> str:
    """The .err of that run: torchrun's warning, with its time and process id."""
    return (f"W1121 07:{seed % 60:02d}:47.{seed:06d} {4000 + seed} torch/distributed/run.py:874] Setting "
            f"OMP_NUM_THREADS environment variable for each process to be 1 in default\n")


def write_graded(out, student: str, zip_path, log: str, wrong=(), rubric=None) -> None:
    """OUT/students/<student>/grading.json as `grade` writes it for the hand-in `zip_path`: every check
    passed but the `wrong` ones [(part, check, weight_digest, diagnosis)]."""
    rubric = rubric or load_rubric()
    result = new_result(student, zip_path.name, hashlib.sha256(zip_path.read_bytes()).hexdigest(), rubric)
    result.status, result.score = Status.GRADED, 100.0
    for part in PART_IDS:
        checks = [CheckOutcome(check=c.name, hidden=c.hidden, world_size=c.world_size, status=Status.PASSED,
                               message="matches the reference") for c in rubric.checks]
        result.parts[part] = PartResult(part=part, status=Status.PASSED, score=25.0, max_score=25.0,
                                        rerun_points=20.0, log_points=5.0, message="passed", checks=checks)
    result.log = parse_log(log).to_dict()
    data = result.to_dict()
    for part, check, digest, diagnosis in wrong:
        outcome = next(o for o in data["parts"][part]["checks"] if o["check"] == check)
        outcome.update(status="failed", diagnosis=diagnosis, message=f"wrong weight on every rank: {diagnosis}",
                       weight_digest=digest)
        data["parts"][part]["status"] = "failed"
    kit.write_json(out / "students" / student / "grading.json", data, sort_keys=True)


# --- A class written from the course's original handout (its code, not the kit's skeleton) -------

HANDOUT = kit.ROOT / "tests" / "data" / "handout_literal" / "assignment4.py"   # the handout's code, answered
# Each TODO's answer as the handout's code holds it (micro: its two lines, apart in the handout).
HANDOUT_ANSWERS = dict(REFERENCE, micro="micro_outputs = model(micro_inputs)",
                       micro_loss="micro_loss = loss_fn(micro_outputs, micro_targets)",
                       shards='weight_shards = [torch.zeros(input_dim, output_dim // world_size, device="cuda") '
                              'for _ in range(world_size)]')


def handout_fill(answers: dict, handout: str = None) -> str:
    """The handout's code (tests/data/handout_literal) with `answers` (TODO key -> code) in place of
    its own answers, each at the first place the handout has it, and the style's helpers before
    Part 1: what a student who worked from the handout, not the kit's skeleton, hands in."""
    text = handout if handout is not None else HANDOUT.read_text()
    answers = dict(answers)
    if "micro" in answers:   # the handout keeps a check between the micro-batch's two lines
        answers["micro"], _, answers["micro_loss"] = answers["micro"].partition("\n")
    for key, new in answers.items():
        if key == "helpers":
            text = text.replace("### Part 1", textwrap.dedent(new).strip("\n") + "\n\n\n### Part 1", 1)
            continue
        old = HANDOUT_ANSWERS[key].splitlines()
        lines = text.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.strip() == old[0]
                  and [x.strip() for x in lines[i:i + len(old)]] == old)
        indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
        lines[at:at + len(old)] = [indent + c + "\n" for c in new.splitlines()]
        text = "".join(lines)
    return text
