"""A corpus of hand-ins made from the reference solution by small mutations, with what each must get.

Each mutant is a list of exact text replacements on the reference (each must match exactly once,
so a change to the reference that breaks a mutant fails loudly), the part it breaks, and the
status and words of the diagnosis that part must get at the default check. `build_handin` writes
a hand-in zip: the code, the provided utils.py, and a .log/.err pair.
"""

import copy
import hashlib
import io
import math
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from grader.parts import BY_ID
from grader.instructor.skeleton import make_skeleton
from grader.rubric import Check, Rubric, load_rubric

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "assignment_4" / "reference" / "assignment4.py"
UTILS = ROOT / "assignment_4" / "utils.py"
DATA = Path(__file__).resolve().parent / "data"
# The configuration the diagnoses below name, and the numbers the "written into the code" mutants write.
DEFAULT = load_rubric().default_check
# Full marks under the course's rubric, as grading.json holds them and as grades.csv writes them:
# every part's points (a bonus part's too, where the course turns one on: then above max_score).
FULL = sum(p.log + p.rerun for p in load_rubric().parts.values())
FULL_CSV = f"{FULL:g}"
# Short timeouts, so that a hand-in that hangs costs seconds, not minutes.
FAST = {"timeouts": {"part": 3, "process_group": 2, "world_start": 30, "handin": 300}}


def fitted(data: dict) -> dict:
    """A copy of rubric `data` (as YAML reads it) in which every size that an optional part it turns
    on splits over the ranks (grader.parts: `splits`) divides by each world size its check runs at,
    set to the nearest multiple, as the rubric's refusal says to do: a course without that part may
    have such a check (a world of 3 ranks). A test that adds a check to a course's rubric fits it."""
    data = copy.deepcopy(data)
    on = [BY_ID[part] for part, points in (data.get("parts") or {}).items()
          if points is not None and part in BY_ID and BY_ID[part].optional]
    public_sizes = data.get("public_world_sizes", Rubric().public_world_sizes)
    for check in data.get("checks") or []:
        sizes = [check.get("world_size", Check().world_size)] + ([] if check.get("hidden") else public_sizes)
        step = math.lcm(*sizes)
        for size in dict.fromkeys(size for part in on for size, by, _ in part.splits if by == "world_size"):
            value = check.get(size, getattr(Check(), size))
            if value % step:
                check[size] = step * max(1, round(value / step))
    return data


def built_on(part: str) -> set:
    """The ids of the optional parts whose code builds on `part`, where a mistake in `part` may fail
    them too: every optional part builds on the parts always on (Part 4's f and g, the step), and an
    optional part on those it needs (grader.parts: `needs`, directly or not)."""
    if not BY_ID[part].optional:
        return {p.id for p in BY_ID.values() if p.optional}
    found, grew = set(), True
    while grew:
        more = {p.id for p in BY_ID.values() if ({part} | found) & set(p.needs)} - found
        found, grew = found | more, bool(more)
    return found


PART5 = {"megatron_mlp": {"log": 2, "rerun": 8, "bonus": True}}   # Part 5 turned on, as a bonus
PART6 = {"vocab_parallel": {"log": 2, "rerun": 8, "bonus": True}}   # Part 6 turned on, as a bonus
PART7 = {"transformer_block": {"log": 2, "rerun": 8, "bonus": True}}   # Part 7 turned on, as a bonus
PART8 = {"sequence_parallel": {"log": 2, "rerun": 8, "bonus": True}}   # Part 8 turned on, as a bonus


def without_optional(data: dict) -> dict:
    """A copy of rubric `data` (as YAML reads it) with every optional part off (null, as an overlay
    read on top of the course's rubric turns one off): where a test that turns parts on starts, so
    that it grades those parts alone in any course."""
    data = copy.deepcopy(data)
    data["parts"] = {k: None if k in BY_ID and BY_ID[k].optional else v for k, v in (data.get("parts") or {}).items()}
    return data


def _with(data: dict, *parts: dict) -> dict:
    data = copy.deepcopy(data)
    for part in parts:
        data["parts"] = {**(data.get("parts") or {}), **part}
    return fitted(data)


def with_part5(data: dict) -> dict:
    """A copy of rubric `data` with Part 5, Megatron's MLP, turned on as a bonus, fitted."""
    return _with(data, PART5)


def with_part6(data: dict) -> dict:
    """A copy of rubric `data` with Part 6, the vocab-parallel loss, turned on as a bonus, fitted."""
    return _with(data, PART6)


def with_part7(data: dict) -> dict:
    """A copy of rubric `data` with Part 7, the transformer block, turned on as a bonus, with Parts 5
    and 6 it builds on, fitted."""
    return _with(data, PART5, PART6, PART7)


def with_part8(data: dict) -> dict:
    """A copy of rubric `data` with Part 8, sequence parallelism, turned on as a bonus, with Parts 5-7
    it builds on, fitted."""
    return _with(data, PART5, PART6, PART7, PART8)


# Every optional part on (the last part's turns on those it builds on): what the course's copy runs.
with_every_part = with_part8


def fast_rubric(tmp: Path, source: Path = ROOT / "grader" / "rubric.yaml", **changes) -> Path:
    """A copy of the rubric `source` with FAST timeouts and `changes`, written into `tmp`."""
    data = yaml.safe_load(source.read_text())
    data.update(FAST)
    data.update(changes)
    path = tmp / f"fast-{source.name}"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Mutant:
    part: str                 # the part it breaks ("" when it breaks none or all)
    edits: list               # [(old, new)], applied in order, each matching exactly once
    status: str = "failed"    # the part's status
    diagnosis: str = ""       # words the part's message must contain
    others: str = "passed"    # the status of every other part
    slow: bool = False        # waits for a timeout
    hidden_only: bool = False  # passes every public check: only a hidden check catches it (so the
                               # log, which the public check corroborates, still counts)
    log_counts: bool = False  # fails a public check, but not the first (the log's own configuration,
                              # which corroborates the log): its log still counts
    also: tuple = ()          # other parts its change breaks too, where the rubric grades them (code
                              # they share: Part 5's f is Part 4's BroadcastParallel)
    or_crashes: bool = False  # crashes instead, at sizes where its wrong shape cannot be made at all


MUTANTS = {
    "dp_summed": Mutant("data_parallel", [("        param.grad.div_(world_size)\n", "")],
                        diagnosis=f"summed over the {DEFAULT.world_size} ranks, not averaged"),
    "dp_no_allreduce": Mutant("data_parallel", [
        ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n", "        pass\n"),
        ("        param.grad.div_(world_size)\n", "")],
        diagnosis="stepped on its own slice of the batch only"),
    "dp_whole_batch_everywhere": Mutant("data_parallel", [
        ('    local_batch_size = divide(global_batch_size, world_size, "global_batch_size", "world_size")\n',
         "    local_batch_size = global_batch_size\n"),
        ("    start_idx = rank * local_batch_size\n", "    start_idx = 0\n"),
        ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n", "        pass\n"),
        ("        param.grad.div_(world_size)\n", "")],
        diagnosis="never all-reduced the gradients"),
    "acc_unscaled": Mutant("grad_accumulation", [
        ("        scaled_loss = micro_loss / accumulation_steps\n", "        scaled_loss = micro_loss\n")],
        diagnosis=f"not divided by accumulation_steps = {DEFAULT.accumulation_steps}"),
    "acc_zero_grad_in_loop": Mutant("grad_accumulation", [
        ("    for i in range(accumulation_steps):\n",
         "    for i in range(accumulation_steps):\n        optimizer.zero_grad()\n")],
        diagnosis="only the last micro-batch's gradient"),
    "baseline_sum": Mutant("baseline", [
        ('    loss_fn = nn.MSELoss(reduction="mean")\n\n    # Create a synthetic batch',
         '    loss_fn = nn.MSELoss(reduction="sum")\n\n    # Create a synthetic batch')],
        diagnosis="a sum, not a mean"),
    "baseline_wrong_sign": Mutant("baseline", [
        ("    loss = loss_fn(outputs, targets)\n", "    loss = -loss_fn(outputs, targets)\n")],
        diagnosis="wrong sign"),
    "baseline_no_step": Mutant("baseline", [
        ("    loss.backward()\n    optimizer.step()\n    # END SOLUTION\n\n    return initial_weight",
         "    loss.backward()\n    # END SOLUTION\n\n    return initial_weight")],
        diagnosis="did not change"),
    "tp_returns_shard": Mutant("tensor_parallel", [
        ("    return global_updated_weight\n", "    return local_updated_weight\n")],
        diagnosis="one rank's shard of the columns"),
    "tp_own_shard_only": Mutant("tensor_parallel", [
        ("    dist.all_gather(weight_shards, local_updated_weight)\n",
         "    weight_shards = [initial_weight[:, r * local_output_dim:(r + 1) * local_output_dim].to(device)\n"
         "                     for r in range(world_size)]\n"
         "    weight_shards[rank] = local_updated_weight\n")],
        diagnosis="right on rank 0's shard only"),
    "tp_without_communication": Mutant("tensor_parallel", [
        ("    model = FullColumnParallelLinear(initial_weight, world_size, rank).to(device)\n",
         "    model = CustomLinearLayer(initial_weight).to(device)\n"),
        ("    local_updated_weight = model.W.detach().contiguous()\n",
         "    return model.W.detach()\n    local_updated_weight = model.W.detach().contiguous()\n")],
        diagnosis="each rank took the whole step alone"),
    "crash_on_one_rank": Mutant("data_parallel", [
        ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
         "        if dist.get_rank() == 1:\n            raise RuntimeError('rank 1 lost its way')\n"
         "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n")],
        status="crashed", diagnosis="rank 1 lost its way", slow=True),
    "deadlock_skipped_collective": Mutant("data_parallel", [
        ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
         "        if dist.get_rank() != 0:\n            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n")],
        status="timeout", diagnosis="timed out", slow=True),
    "hang": Mutant("tensor_parallel", [
        ("    local_output_dim = divide(output_dim, world_size, \"output_dim\", \"world_size\")\n",
         "    __import__('time').sleep(10 ** 6)\n")],
        status="timeout", diagnosis="did not finish", slow=True),
    # Shards joined along the wrong dimension, permuted, or aliased in the gather list.
    "tp_cat_rows": Mutant("tensor_parallel", [
        ("    global_updated_weight = torch.cat(weight_shards, dim=1)\n",
         "    global_updated_weight = torch.cat(weight_shards, dim=0).reshape(input_dim, output_dim)\n")],
        diagnosis="joined along dimension 0 (the rows) and then reshaped"),
    "tp_reversed": Mutant("tensor_parallel", [
        ("    global_updated_weight = torch.cat(weight_shards, dim=1)\n",
         "    global_updated_weight = torch.cat(weight_shards[::-1], dim=1)\n")],
        diagnosis="every shard is right but they were put together in the wrong order"),
    "tp_aliased_gather_list": Mutant("tensor_parallel", [
        ("    weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]\n",
         "    weight_shards = [torch.empty_like(local_updated_weight)] * world_size\n")],
        diagnosis="every block of columns is the same shard, the last rank's"),
    # Part 4's layer: f left out, f's backward broken, the gather's backward broken. The public
    # backward check (the layer alone at the default sizes) catches them; the step passes, so the log counts.
    "tp_no_f": Mutant("tensor_parallel", [("        X = BroadcastParallel.apply(X)\n", "        X = X\n")],
                      diagnosis="gradient of X is only its own columns' share, G_r W_r^T: f (BroadcastParallel", log_counts=True),
    "tp_f_backward_without_all_reduce": Mutant("tensor_parallel", [
        ("        dist.all_reduce(grad, op=dist.ReduceOp.SUM)\n        return grad\n", "        return grad\n")],
        diagnosis="only its own columns' share", log_counts=True, also=("megatron_mlp",)),
    "tp_gather_backward_rank0": Mutant("tensor_parallel", [
        ("        return grad_slices[dist.get_rank()].contiguous()\n", "        return grad_slices[0].contiguous()\n")],
        diagnosis="every rank's shard took the step of rank 0's columns: the gather's backward"),
    # The world laid out as 4 nodes: the shard picked by the local rank.
    "tp_local_rank": Mutant("tensor_parallel", [
        ("    rank, world_size = dist.get_rank(), dist.get_world_size()\n    local_output_dim",
         "    rank, world_size = int(os.environ[\"LOCAL_RANK\"]), dist.get_world_size()\n    local_output_dim")],
        diagnosis="every rank held the columns of its LOCAL_RANK", hidden_only=True),
    # Accumulation: one micro-batch every time; a micro-batch count written into the code.
    "acc_same_micro_batch": Mutant("grad_accumulation", [
        ("        start_idx = i * micro_batch_size\n", "        start_idx = 0\n")],
        diagnosis="every accumulation step used the first micro-batch"),
    "acc_hard_coded_steps": Mutant("grad_accumulation", [
        ("        scaled_loss = micro_loss / accumulation_steps\n",
         f"        scaled_loss = micro_loss / {DEFAULT.accumulation_steps}\n")],
        diagnosis=f"each micro-batch loss was divided by {DEFAULT.accumulation_steps} written into the code, "
                  f"not by accumulation_steps",
        hidden_only=True),
    # Data parallel: reduce for all-reduce; a world size written into the code; one slice for all.
    "dp_reduce": Mutant("data_parallel", [
        ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
         "        dist.reduce(param.grad, dst=0, op=dist.ReduceOp.SUM)\n")],
        diagnosis="only rank 0 ends with the right weight: the gradients went through dist.reduce"),
    "dp_hard_coded_world_size": Mutant("data_parallel", [
        ("        param.grad.div_(world_size)\n", f"        param.grad.div_({DEFAULT.world_size})\n")],
        diagnosis=f"the summed gradient was divided by {DEFAULT.world_size} written into the code, not by world_size",
        log_counts=True),
    "dp_same_slice": Mutant("data_parallel", [
        ("    start_idx = rank * local_batch_size\n", "    start_idx = 0\n")],
        diagnosis="on every rank the update is the gradient of rank 0's slice of the batch alone"),
    # Part 5 (optional), Megatron's MLP block: graded only where the rubric turns it on.
    "mlp_no_g": Mutant("megatron_mlp", [
        ("        out = ReduceFromModelParallelRegion.apply(partial)\n", "        out = partial\n")],
        diagnosis="each rank used its own partial sum GeLU(X W1_r) W2_r as the block's output: g"),
    "mlp_no_f": Mutant("megatron_mlp", [("        X = CopyToModelParallelRegion.apply(X)\n", "        X = X\n")],
                       diagnosis="each rank's gradient of X is only its own columns' share: f", log_counts=True),
    "mlp_g_backward_reduces": Mutant("megatron_mlp", [
        ("        # BEGIN SOLUTION: return ... (1 line)\n        return grad_output\n",
         "        # BEGIN SOLUTION: return ... (1 line)\n        grad_output = grad_output.contiguous().clone()\n"
         "        dist.all_reduce(grad_output)\n        return grad_output\n")],
        diagnosis="g (ReduceParallel) must all-reduce in forward only"),
    "mlp_w2_cat_columns": Mutant("megatron_mlp", [
        ("    updated_w2 = torch.cat(w2_shards, dim=0)\n", "    updated_w2 = torch.cat(w2_shards, dim=1)\n"),
        ("    check(updated_w2, (hidden_dim, input_dim))\n", "")],   # the shape guard would say it first
        diagnosis="W2's updated shards were put side by side as columns"),
    "mlp_gelu_after_reduce": Mutant("megatron_mlp", [
        ("        out = self.fc2(nn.functional.gelu(self.fc1(X)))\n",
         "        out = nn.functional.gelu(self.fc2(self.fc1(X)))\n")],
        diagnosis="GeLU is applied after the all-reduce"),
    "mlp_gelu_on_partials": Mutant("megatron_mlp", [
        ("        out = self.fc2(nn.functional.gelu(self.fc1(X)))\n", "        out = self.fc2(self.fc1(X))\n"),
        ('        partial = torch.einsum("bi,ij->bj", H_local, self.W).contiguous()\n',
         '        partial = nn.functional.gelu(torch.einsum("bi,ij->bj", H_local, self.W)).contiguous()\n')],
        diagnosis="GeLU is applied to each rank's partial sum"),
    # Part 5's step forged: taken whole, by the single-device MLP, on every rank or on rank 0 and
    # broadcast. Its block (the backward checks) is the reference's: that work is real.
    "mlp_whole_on_every_rank": Mutant("megatron_mlp", [
        ('    local_hidden_dim = divide(hidden_dim, world_size, "hidden_dim", "world_size")\n\n    w1, w2 = init_mlp_weights(seed)\n',
         '    local_hidden_dim = divide(hidden_dim, world_size, "hidden_dim", "world_size")\n'
         '    return mlp_single_step(seed=seed, device=device)\n    w1, w2 = init_mlp_weights(seed)\n')],
        diagnosis="the weights are the single-device MLP's step on its own full W1 and W2, taken whole on one rank"),
    "mlp_whole_on_rank0_broadcast": Mutant("megatron_mlp", [
        ('    local_hidden_dim = divide(hidden_dim, world_size, "hidden_dim", "world_size")\n\n    w1, w2 = init_mlp_weights(seed)\n',
         '    local_hidden_dim = divide(hidden_dim, world_size, "hidden_dim", "world_size")\n'
         '    whole = [w.contiguous() for w in mlp_single_step(seed=seed, device=device)]\n'
         '    for w in whole:\n        dist.broadcast(w, src=0)\n    return tuple(whole)\n'
         '    w1, w2 = init_mlp_weights(seed)\n')],
        diagnosis="the weights are the single-device MLP's step on"),
    # Part 6 (optional), the vocabulary split over the ranks: graded only where the rubric turns it on.
    "vocab_local_max": Mutant("vocab_parallel", [
        ("        shifted = logits - all_reduce_vocab(logits.max(dim=-1).values, dist.ReduceOp.MAX).unsqueeze(-1)\n",
         "        shifted = logits - logits.max(dim=-1).values.unsqueeze(-1)\n")],
        diagnosis="each rank subtracts the max of its own columns only"),
    "vocab_no_max": Mutant("vocab_parallel", [
        ("        shifted = logits - all_reduce_vocab(logits.max(dim=-1).values, dist.ReduceOp.MAX).unsqueeze(-1)\n",
         "        shifted = logits\n")],
        diagnosis="exp of logits near 1e4 overflows", hidden_only=True),
    "vocab_mask_off_by_slice": Mutant("vocab_parallel", [
        ("        start, end = vocab_slice(logits.shape[-1] * world_size, world_size, rank)\n",
         "        start, end = vocab_slice(logits.shape[-1] * world_size, world_size, rank + 1)\n")],
        diagnosis="the targets' mask is off by one slice"),
    "vocab_embedding_unmasked": Mutant("vocab_parallel", [
        ("        share = share * owned.unsqueeze(-1).to(share.dtype)\n", "")],
        diagnosis="rows of tokens held by other ranks are not zeroed"),
    "vocab_embedding_not_reduced": Mutant("vocab_parallel", [
        ("        return VocabReduce.apply(share)\n", "        return share\n")],
        diagnosis="the embedding's output is not all-reduced"),
    "vocab_padding_counted": Mutant("vocab_parallel", [
        ("        valid = targets != ignore_index\n", "        valid = torch.ones_like(targets, dtype=torch.bool)\n")],
        diagnosis="the loss counts the padding targets", hidden_only=True),
    "vocab_one_hot_every_rank": Mutant("vocab_parallel", [
        ("        grad[rows, local] -= owned.to(grad.dtype)\n", "        grad[rows, local] -= 1\n")],
        diagnosis="subtracts the one-hot on every rank"),
    "vocab_no_f": Mutant("vocab_parallel", [("    x = BroadcastParallel.apply(x)\n", "    x = x\n")],
                         diagnosis="the embedding's gradient is only the rank's own columns' share"),
    # The transformer block (optional, on Part 5's layers): graded only where the rubric turns it on.
    "tb_heads_not_divided": Mutant("transformer_block", [
        ("        qkv = qkv.reshape(bsz, seq, 3, self.local_heads, self.head_dim)\n",
         "        qkv = qkv.reshape(bsz, seq, 3, num_heads, -1)\n")],
        diagnosis="the heads are not divided over the ranks",
        or_crashes=True),   # where d / world_size is not a multiple of num_heads (a course's 3 ranks)
    "tb_qkv_ungrouped": Mutant("transformer_block", [
        ("        grouped = torch.cat([torch.cat([q[r], k[r], v[r]], dim=1) for r in range(world_size)], dim=1)\n",
         "        grouped = w_qkv\n")],
        diagnosis="W_qkv's columns were split over the ranks as they lie"),
    "tb_attention_not_reduced": Mutant("transformer_block", [
        ("        out = self.proj(heads)\n", "        out = heads @ self.proj.W\n")],
        diagnosis="the attention's output projection (row-parallel, W_o split by rows) was not reduced"),
    "tb_qkv_without_f": Mutant("transformer_block", [
        ("        qkv = self.qkv(X.reshape(bsz * seq, d))   # the layers take rows of tokens\n",
         "        qkv = X.reshape(bsz * seq, d) @ self.qkv.W\n")],
        diagnosis="each rank's gradient of X through the attention is only its own heads' share"),
    # The tiny transformer's step (Part 7's step checks): its own mistakes, beside the block's.
    "tstep_head_without_f": Mutant("transformer_block", [
        ("    x = BroadcastParallel.apply(norm(x).reshape(bsz * seq, -1))\n", "    x = norm(x).reshape(bsz * seq, -1)\n")],
        diagnosis="the gradient of the head's input is only the rank's own vocabulary columns' share"),
    "tstep_logits_gathered": Mutant("transformer_block", [
        ("    loss = vocab_parallel_cross_entropy(logits, targets.reshape(-1), world_size, rank)\n",
         "    loss = nn.functional.cross_entropy(GatherParallel.apply(logits), targets.reshape(-1))\n")],
        diagnosis="the head's logits were gathered over the ranks"),
    # Sequence parallelism (optional, on Part 7's block): graded only where the rubric turns it on.
    "sp_no_gather": Mutant("sequence_parallel", [
        ("        normed = GatherSequence.apply(self.layer_norm(block.ln1, X))\n",
         "        normed = self.layer_norm(block.ln1, X)\n"),
        ("        H = X + ReduceScatterSequence.apply(self.attend(normed) @ block.attn.proj.W)\n",
         "        H = X + ReduceParallel.apply(self.attend(normed) @ block.attn.proj.W)\n")],
        diagnosis="each rank attends only its own slice of the sequence"),
    "sp_all_reduce_for_reduce_scatter": Mutant("sequence_parallel", [
        ("    reduce_scatter(out, sequence_first(x), op=dist.ReduceOp.SUM)\n",
         "    whole = sequence_first(x)\n    dist.all_reduce(whole)\n"
         "    out = whole.chunk(world_size)[dist.get_rank()]\n")],
        diagnosis="no rank called a reduce-scatter"),
    "sp_layernorm_not_reduced": Mutant("sequence_parallel", [
        ("        weight = BroadcastParallel.apply(norm.weight)\n", "        weight = norm.weight\n")],
        diagnosis="the LayerNorms' weight gradients are each rank's own tokens' share only"),
    "sp_gather_wrong_dim": Mutant("sequence_parallel", [
        ("    return out.transpose(0, 1)   # [seq, bsz, d] -> [bsz, seq, d]\n",
         "    return out.reshape(bsz, world_size * local_seq, d)\n")],
        diagnosis="the all-gathered slices were put back along the wrong dimension"),
    "does_not_parse": Mutant("", [("class CustomLinearLayer(nn.Module):\n", "class CustomLinearLayer(nn.Module:\n")],
                             status="crashed", diagnosis="could not be loaded", others="crashed"),
}


def graded_mutants(rubric) -> list:
    """The mutants whose part `rubric` grades (an optional part's only where it is on)."""
    return [name for name, m in MUTANTS.items() if not m.part or m.part in rubric.parts]


def mutant_params(names) -> list:
    """`names` for parametrize; a mutant only a hidden check catches is about the stock course's
    hidden checks (its four-node check, its backward checks ...), so it is marked stock_rubric."""
    return [pytest.param(name, marks=pytest.mark.stock_rubric) if MUTANTS[name].hidden_only else name
            for name in names]


def mutate(name: str) -> str:
    text = REFERENCE.read_text()
    for old, new in MUTANTS[name].edits:
        count = text.count(old)
        assert count == 1, f"mutant {name}: {old!r} occurs {count} times in the reference"
        text = text.replace(old, new)
    return text


def skeleton(filled=()) -> str:
    """The skeleton, with the parts in `filled` filled in from the reference."""
    keep = [scope for part in filled for scope in BY_ID[part].scopes]
    return make_skeleton(REFERENCE.read_text(), keep=keep)


def refingerprint(log: str, code: str) -> str:
    """A log whose init lines claim to come from `code` (what a forger would write)."""
    digest = hashlib.sha256(code.encode()).hexdigest()
    return re.sub(r"code sha256 [0-9a-f]{64}", f"code sha256 {digest}", log)


@dataclass
class Files:
    """The content of one hand-in: name -> text (None leaves a file out)."""
    code: str
    log: str = None
    err: str = ""
    utils: str = field(default_factory=lambda: UTILS.read_text())
    log_name: str = "assignment4-1234.log"
    extra: dict = field(default_factory=dict)   # more members: name -> bytes
    err_name: str = None                        # default: the log's name with .err for its extension


def zip_bytes(files: Files, folder: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        err_name = files.err_name or files.log_name.rsplit(".", 1)[0] + ".err"
        members = {"assignment4.py": files.code, "utils.py": files.utils, files.log_name: files.log,
                   err_name: files.err}
        for name, text in members.items():
            if text is not None:
                z.writestr(folder + name, text)
        for name, data in files.extra.items():
            z.writestr(name, data)
    return buffer.getvalue()


def write_zip(path: Path, files: Files, folder: str = "") -> Path:
    path.write_bytes(zip_bytes(files, folder))
    return path

