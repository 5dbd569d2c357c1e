"""The integrity report's planted set: a class of independent hand-ins, and copies of some of them
disguised every way a copier would (tests/integrity_disguise.py), with the pairs that are copies
known. tests/test_integrity_planted.py holds the report to its precision and recall on it;
benchmarks/integrity_pairs.py prints them, by disguise and at scale.

The class: three styles of tests/integrity_corpus.py and eight more students below, each
writing the TODOs in a way of their own and adding what students add (prints, asserts, helper
functions, timing, a part left undone), every one a correct solution written independently;
three students who wrote the expected answers and nothing else, as many do; and six written
from the course's original handout (its code, not the kit's skeleton): the other three styles,
and three students who changed the handout around their answers as real hand-ins do.
"""

import hashlib
import random
from dataclasses import dataclass, field
from itertools import combinations

from tests.integrity_corpus import STYLES, fill, handout_fill
from tests.integrity_disguise import DISGUISES

# A TODO key left out of a student's answers gets the reference's answer (integrity_corpus.fill);
# None leaves the TODO as it is (the part not done: Part 5, which most courses leave off).
PART5 = ("reduce", "reduce_backward", "mlp_f", "rows", "partial", "block", "w2")
NO_PART5 = dict.fromkeys(PART5)

STUDENTS = {
    # Prints what happens, as a student debugging on the cluster does.
    "printer": NO_PART5 | {
        "loss": "loss = loss_fn(outputs, targets)\n"
                "print(f\"[single_step] rank {dist.get_rank()} loss={loss.item():.6f}\")",
        "step": "optimizer.zero_grad()\nloss.backward()\n"
                "print(f\"[single_step] grad norm {model.W.grad.norm().item():.5f}\")\noptimizer.step()",
        "scale": "scaled_loss = micro_loss / accumulation_steps\n"
                 "print(f\"  micro-batch {i}: loss {micro_loss.item():.5f} -> scaled {scaled_loss.item():.5f}\")",
        "allreduce": "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n"
                     "if dist.get_rank() == 0:\n"
                     "    print(f\"[dp] summed grad[0, 0] = {param.grad[0, 0].item():.6f} over {world_size} ranks\")",
        "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]\n"
                  "print(f\"[tp] rank {rank} holds a shard of shape {tuple(local_updated_weight.shape)}\")",
        "edits": [("    local_loss.backward()\n",
                   "    local_loss.backward()\n    print(f\"[dp] rank {rank}: rows {start_idx}:{end_idx}, "
                   "local loss {local_loss.item():.6f}\")\n")],
    },
    # Writes the mathematics out by hand.
    "manual": NO_PART5 | {
        "forward": "outputs = inputs.matmul(model.W)",
        "loss": "loss = torch.mean(torch.square(outputs - targets))",
        "slice": "rows = torch.arange(global_batch_size).chunk(accumulation_steps)[i]\n"
                 "start_idx, end_idx = int(rows[0]), int(rows[-1]) + 1",
        "micro": "micro_outputs = micro_inputs.matmul(model.W)\n"
                 "micro_loss = torch.mean(torch.square(micro_outputs - micro_targets))",
        "allreduce": "summed = param.grad.detach().clone()\ndist.all_reduce(summed)\nparam.grad.copy_(summed)",
        "shards": "weight_shards = [torch.empty(input_dim, local_output_dim, dtype=local_updated_weight.dtype, "
                  "device=local_updated_weight.device) for _ in range(world_size)]",
    },
    # Cuts the batch from a table of bounds.
    "bounds": NO_PART5 | {
        "slice": "bounds = [k * micro_batch_size for k in range(accumulation_steps + 1)]\n"
                 "start_idx, end_idx = bounds[i], bounds[i + 1]",
        "scale": "scaled_loss = micro_loss * (micro_batch_size / global_batch_size)",
        "allreduce": "if world_size > 1:\n    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
        "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _rank in range(dist.get_world_size())]",
    },
    # Logs through a helper of their own, rank 0 only.
    "logger": NO_PART5 | {
        "helpers": '''
            def say(*what):
                """Log on rank 0 only, so that four ranks do not print everything four times."""
                if not dist.is_initialized() or dist.get_rank() == 0:
                    log(" ".join(str(w) for w in what))
            ''',
        "loss": "loss = loss_fn(outputs, targets)\nsay(\"baseline loss\", round(loss.item(), 6))",
        "scale": "scaled_loss = micro_loss / accumulation_steps\nsay(\"micro-batch\", i, \"of\", accumulation_steps)",
        "allreduce": "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\nsay(\"all-reduced a gradient of shape\", "
                     "tuple(param.grad.shape))",
        "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]\n"
                  "say(\"gathering\", world_size, \"shards of\", tuple(local_updated_weight.shape))",
    },
    # Does the optional Part 5, in a style of their own.
    "megatron": {
        "batch": "inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)",
        "step": "optimizer.zero_grad()\nloss.backward()\noptimizer.step()",
        "allreduce": "dist.all_reduce(param.grad)",
        "reduce": "summed = torch.clone(x).contiguous()\ndist.all_reduce(summed, op=dist.ReduceOp.SUM)",
        "reduce_backward": "return grad_output",
        "mlp_f": "X = BroadcastParallel.apply(X)",
        "rows": "start, end = rank * self.local_in_dim, (rank + 1) * self.local_in_dim",
        "partial": "partial = torch.matmul(H_local, self.W)\nout = ReduceParallel.apply(partial.contiguous())",
        "block": "hidden = nn.functional.gelu(self.fc1(X))\nout = self.fc2(hidden)",
        "w2": "updated_w2 = torch.vstack(w2_shards)",
    },
    # Times every part.
    "timer": NO_PART5 | {
        "helpers": '''
            import time


            class Stopwatch:
                """with Stopwatch("name"): ... logs how long the block took on rank 0."""

                def __init__(self, name):
                    self.name = name

                def __enter__(self):
                    self.start = time.perf_counter()
                    return self

                def __exit__(self, *exc):
                    if dist.get_rank() == 0:
                        log(f"[time] {self.name}: {1000 * (time.perf_counter() - self.start):.1f} ms")
                    return False
            ''',
        "micro": "with Stopwatch(f\"micro-batch {i}\"):\n    micro_outputs = model(micro_inputs)\n"
                 "    micro_loss = loss_fn(micro_outputs, micro_targets)",
        "allreduce": "with Stopwatch(\"all_reduce\"):\n    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
        "shards": "weight_shards = [local_updated_weight.new_empty(local_updated_weight.shape) "
                  "for _ in range(world_size)]",
        "edits": [("    result = run_part(\"Baseline\", single_step, seed=seed, device=device)\n",
                   "    with Stopwatch(\"Part 1\"):\n"
                   "        result = run_part(\"Baseline\", single_step, seed=seed, device=device)\n")],
    },
    # Checks everything twice.
    "careful": NO_PART5 | {
        "batch": "inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)\n"
                 "assert inputs.shape[0] == targets.shape[0] == global_batch_size",
        "loss": "loss = loss_fn(outputs, targets)\nassert torch.isfinite(loss), f\"loss is {loss.item()}\"",
        "slice": "start_idx = i * micro_batch_size\nend_idx = start_idx + micro_batch_size\n"
                 "assert 0 <= start_idx < end_idx <= global_batch_size, (i, start_idx, end_idx)",
        "scale": "scaled_loss = micro_loss / accumulation_steps\nassert scaled_loss.dim() == 0",
        "allreduce": "assert param.grad is not None, \"backward() did not reach this parameter\"\n"
                     "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
        "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]\n"
                  "assert len(weight_shards) == world_size and all(s.is_contiguous() for s in weight_shards)",
    },
    # Writes it compactly, with lambdas and comprehensions.
    "compact": NO_PART5 | {
        "loss": "loss = (lambda d: (d * d).mean())(outputs - targets)",
        "step": "[f() for f in (optimizer.zero_grad, loss.backward, optimizer.step)]",
        "slice": "start_idx, end_idx = (i * micro_batch_size, (i + 1) * micro_batch_size)",
        "micro": "micro_outputs, micro_loss = (lambda o: (o, loss_fn(o, micro_targets)))(model(micro_inputs))",
        "scale": "scaled_loss = micro_loss.div(accumulation_steps)",
        "allreduce": "dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)",
        "shards": "weight_shards = list(map(lambda _: torch.empty_like(local_updated_weight), range(world_size)))",
    },
}
# Students of a course that hands out its original handout's code (tests/data/handout_literal),
# not the kit's skeleton: answers of their own, and what they changed around them (comments,
# prints, the parts moved about, lists for tuples), text edits (old, new) of that code.
HANDOUT_STUDENTS = {
    "hreal_commenter": ({"forward": "outputs = model.forward(inputs)",
                         "slice": "start_idx = micro_batch_size*i\nend_idx = micro_batch_size*(i+1)",
                         "micro": "micro_outputs = model.forward(micro_inputs)\n"
                                  "micro_loss = loss_fn(micro_outputs, micro_targets)"}, [
        ("    full_inputs, full_targets = create_batch(global_batch_size, input_dim, output_dim,\n        seed=seed, "
         "device=device)\n",
         "    # Every worker draws the same batch from the same seed, then keeps its own rows\n"
         "    full_inputs, full_targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, "
         "device=device)\n    assert full_inputs.shape[0] % world_size == 0, \"batch must split evenly\"\n"),
        ("    torch.manual_seed(seed)\n    initial_weight = torch.randn(input_dim, output_dim)\n    model = "
         "CustomLinearLayer(initial_weight).to(device)\n",
         "    # Set the seed for reproducibility\n    torch.manual_seed(seed)\n    # Generate a weight matrix\n"
         "    initial_weight = torch.randn(input_dim, output_dim)\n    # The model around the weight\n"
         "    model = CustomLinearLayer(initial_weight).to(device)\n"),
        ("        param.grad.div_(world_size)\n",
         "        # Average the gradients by dividing by world_size (in place)\n        param.grad.div_(world_size)\n"
         "        print(f\"[Rank {rank}] Gradient after all_reduce: {param.grad.norm().item():.6f}\")\n"),
        ("    weight_shards = [", "    # a list of empty tensors on the GPU for all_gather to fill\n    weight_shards = [")]),
    "hreal_lists": ({"batch": "inputs, targets = create_batch(batch_size=global_batch_size, input_dim=input_dim, "
                              "output_dim=output_dim, seed=seed, device=device)",
                     "shards": "weight_shards = [torch.zeros_like(local_updated_weight) for _ in range(world_size)]"}, [
        ("        check(X, (local_bsz, self.in_dim))\n        X = BroadcastParallel",
         "        check(X, [local_bsz, self.in_dim])\n        X = BroadcastParallel"),
        ("        check(local_out, (local_bsz, self.local_out_dim))", "        check(local_out, [local_bsz, self.local_out_dim])"),
        ("        check(out, (local_bsz, self.out_dim))\n        return out",
         "        check(out, [local_bsz, self.out_dim])\n        return out"),
        ("    check(outputs, (global_batch_size, output_dim))\n    loss = loss_fn(outputs, full_targets)",
         "    check(outputs, [global_batch_size, output_dim])\n\n    loss = loss_fn(outputs, full_targets)\n"
         "    if rank == 0:\n        print(f\"tensor parallel loss: {loss.item():.6f}\")"),
        ("    local_updated_weight = model.W.detach()\n",
         "    # each rank holds a shard [input_dim, output_dim // world_size]\n"
         "    local_updated_weight = model.W.detach().contiguous()\n")]),
    "hreal_quiet": ({"allreduce": "dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)",
                     "scale": "scaled_loss = micro_loss * (1 / accumulation_steps)",
                     "shards": "weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]"}, [
        ("rank, local_rank, world_size = init_distributed()\n",
         "rank, local_rank, world_size = init_distributed()\n\n\ndef say(msg):\n    if rank == 0:\n"
         "        print(f\"[Rank {rank}] {msg}\")\n"),
        ("    optimizer.step()\n    return model.W.detach()\n\nif rank == 0:\n    print(f\"[Rank {rank}] Compute the "
         "updated weight using data",
         "    optimizer.step()\n    say(f\"step done, |W| = {model.W.norm().item():.4f}\")\n"
         "    return model.W.detach()\n\nif rank == 0:\n    print(f\"[Rank {rank}] Compute the updated weight using data"),
        ("    print(f\"[Rank {rank}] Compute the updated weight using data parallelism.\")",
         "    say(\"Compute the updated weight using data parallelism.\")\n    say(f\"{world_size} ranks, "
         "{local_batch_size} rows each\")")]),
}
# Students who wrote the expected answers and nothing else: the class's common ground.
EXPECTED = {"expected_1": NO_PART5, "expected_2": {}, "expected_3": NO_PART5 | {"step": "optimizer.zero_grad()\n"
                                                                                      "loss.backward()\noptimizer.step()"}}


HANDOUT_STYLES = ("terse", "loops", "einsum")   # these three wrote from the course's handout


def independent_class() -> dict:
    """name -> code of every independent hand-in of the planted set."""
    styles = {name: fill(answers) for name, answers in STYLES.items() if name not in HANDOUT_STYLES}
    students = {name: _with_edits(fill({k: v for k, v in answers.items() if k != "edits"}), answers.get("edits", ()))
                for name, answers in STUDENTS.items()}
    expected = {name: fill(answers) for name, answers in EXPECTED.items()}
    handout = {f"handout_{name}": handout_fill(STYLES[name]) for name in HANDOUT_STYLES}
    return styles | students | expected | handout | handout_class()


def handout_class() -> dict:
    """name -> code of the students who wrote from the course's original handout."""
    return {name: _with_edits(handout_fill(answers), edits) for name, (answers, edits) in HANDOUT_STUDENTS.items()}


def _with_edits(code: str, edits) -> str:
    for old, new in edits:
        assert old in code, old
        code = code.replace(old, new, 1)
    return code


@dataclass
class Planted:
    """A batch of hand-ins (name -> code) and which of them are copies of which."""
    code: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)     # name -> the original it copies (itself for an original)
    disguise: dict = field(default_factory=dict)   # copy's name -> the disguise made of it

    def is_copy_pair(self, a: str, b: str) -> bool:
        return self.origin.get(a, a) == self.origin.get(b, b)

    @property
    def copy_pairs(self) -> set:
        return {tuple(sorted(p)) for p in combinations(self.code, 2) if self.is_copy_pair(*p)}


ORIGINALS = ("defensive", "printer", "manual", "logger", "megatron", "careful", "timer", "helper", "bounds", "compact",
             "functional", "handout_terse", "handout_loops", "hreal_commenter", "hreal_lists", "hreal_quiet")


def planted_set(disguise: str, originals=ORIGINALS, seed: int = 2026, klass: dict = None) -> Planted:
    """The independent class (`klass`, default independent_class()) and a copy of each original
    made with `disguise`, each copier with a random generator of their own: one batch of the
    planted set. Every disguise gets a batch of its own, as a class has a copy here and there, not
    a dozen of one hand-in (a group that large shares what the class shares, and is left out)."""
    rng = random.Random(f"{seed}-{disguise}")
    planted = Planted()
    for name, code in (klass or independent_class()).items():
        planted.code[name] = code
        planted.origin[name] = name
    for original in originals:
        copy = f"{original}~{disguise}"
        planted.code[copy] = DISGUISES[disguise](planted.code[original], random.Random(rng.random()))
        planted.origin[copy], planted.disguise[copy] = original, disguise
    return planted


@dataclass
class Score:
    """What the report listed against what was planted."""
    listed: set
    planted: set

    @property
    def found(self) -> set:
        return self.listed & self.planted

    @property
    def precision(self) -> float:
        return len(self.found) / len(self.listed) if self.listed else 1.0

    @property
    def recall(self) -> float:
        return len(self.found) / len(self.planted) if self.planted else 1.0


def score(listed, planted: Planted) -> Score:
    """Precision and recall of `listed` pairs over the copy pairs of `planted`; a pair of two
    copies of one original is a copy pair too."""
    return Score({tuple(sorted(p)) for p in listed}, planted.copy_pairs)


def facts_of(planted: Planted, base, read: dict = None) -> list:
    """Each hand-in's facts as the integrity command reads them from its unpacked assignment4.py;
    `read` keeps each code's own code between batches (the class is in every batch)."""
    from grader.integrity.code import own_code, own_lines
    from grader.integrity.facts import HandinFacts
    read = {} if read is None else read
    found = []
    for name, code in planted.code.items():
        if code not in read:
            read[code] = (own_code(code, base), own_lines(code, base))
        digest = hashlib.sha256(code.encode()).hexdigest()
        found.append(HandinFacts(student=name, source=f"{name}.zip", sha256=digest, student_id=name, found=True,
                                 code_sha256=digest, code=code, own=read[code][0], own_lines=read[code][1]))
    return found


def evaluate(disguises=tuple(DISGUISES), base=None, common: int = None, read: dict = None) -> dict:
    """disguise -> Score of the integrity report's pairs on that disguise's batch of the planted set
    (`read`: as for facts_of)."""
    from grader.integrity.code import Base
    from grader.integrity.commands import default_common
    from grader.integrity.evidence import find_pairs
    base = base or Base.from_files()
    klass, scores, read = independent_class(), {}, {} if read is None else read
    for disguise in disguises:
        planted = planted_set(disguise, klass=klass)
        pairs, _ = find_pairs(facts_of(planted, base, read), common or default_common(len(planted.code)), base)
        scores[disguise] = score([(p.student_a, p.student_b) for p in pairs], planted)
    return scores


def five_from_the_handout(disguise: str = "rename+strip", seed: int = 7) -> Planted:
    """The batch of issue 33's report: three independent hand-ins written from the course's own
    handout, a byte-identical copy of one and a disguised copy of another."""
    planted = Planted()
    for name, code in handout_class().items():
        planted.code[name], planted.origin[name] = code, name
    planted.code["hreal_lists~bytes"], planted.origin["hreal_lists~bytes"] = planted.code["hreal_lists"], "hreal_lists"
    copy = f"hreal_commenter~{disguise}"
    planted.code[copy] = DISGUISES[disguise](planted.code["hreal_commenter"], random.Random(seed))
    planted.origin[copy], planted.disguise[copy] = "hreal_commenter", disguise
    return planted
