"""How much a rank may send back: a part's tensors are bounded by the part's own sizes, at the rank
before they are framed and again where the supervisor reads them, and a world's report is made to
fit the channel's frame (grader.rerun.wire.channel.MAX_MESSAGE_BYTES), part by part.

What a part returns at a check (d_in, d_out, h: its input, output and hidden widths; B: its
global batch; p: its world size), as its record says (grader.parts: `room`, `should`):

    step, Parts 1-4        W [d_in, d_out]
    step, Part 5           W1 [d_in, h], W2 [h, d_in]
    backward, Part 4       output [B, d_out], input_grad [B, d_in], weight_grad [d_in, d_out / p]
    backward, Part 5       output [B, d_in], input_grad [B, d_in], w1_grad [d_in, h / p], w2_grad [h / p, d_in]
    backward, the block    output [B, S, d], input_grad [B, S, d], and its 8 parameters' gradients
                           (grader.parts.transformer_block: the largest W_qkv's shard [d, 3d / p])

`room` is the most values one of them holds. A tensor of more than twice that (and more than
FLOOR) is refused: a wrong shape of about the right size still reaches the verdict, which names
it, while a part of a 64 x 32 weight that returns 1024 x 1024 values fails at once, on its own
clock, with the grader's own words (`refusal`: the sizes at a public check, none at a hidden one),
never as a report too large to carry. Whatever is the hand-in's doing costs that part only.
"""

from grader.parts import BY_ID, kind_of, sent_budget, sent_stride
from grader.rerun.wire import channel, protocol
from grader.rerun.wire.protocol import ErrorInfo, RankStatus, Result, WorldReport

FLOOR = 4096          # values any tensor may have, however small the check
EXTRAS = 10           # tensors a part returns beside its first (the transformer block's backward: 9)
COMM, DEVICES, SKIPPED = 1000, 100, 2000   # records kept of a rank's word
EXCEPTION, TRACEBACK, DETAIL = 2000, 6000, 4000   # characters kept of a text
REPORT_BYTES = channel.MAX_MESSAGE_BYTES - (1 << 20)   # a report's bytes, with room to spare


class TooLarge(ValueError):
    """A returned tensor of more values than its part may return (`values`)."""

    def __init__(self, values: int):
        super().__init__(f"a returned tensor of {values} values")
        self.values = values


def room(part: str, check: dict) -> int:
    """The most values one tensor that `part` returns at `check` (the job's check mapping) holds."""
    return BY_ID[part].room(check, kind_of(check))


def allowed(part: str, check: dict) -> int:
    return min(channel.MAX_TENSOR_NUMEL, max(2 * room(part, check), FLOOR))


def encode(tensor, part: str, check: dict) -> dict:
    """channel.encode_tensor's form of a tensor `part` returned; TooLarge (before a byte is copied)
    when it holds more than the part may return."""
    if tensor.numel() > allowed(part, check):
        raise TooLarge(tensor.numel())
    return channel.encode_tensor(tensor)


def _values(encoded) -> int:
    """The values an encoded tensor claims (its shape) or carries (its data: base64 of float64,
    32 characters for 3 values), whichever is more; anything that is not a tensor counts as past
    every limit."""
    if encoded is None:
        return 0
    if not isinstance(encoded, dict) or not isinstance(encoded.get("data", ""), str):
        return channel.MAX_TENSOR_NUMEL + 1
    shape, claimed = encoded.get("shape"), 1
    if not isinstance(shape, list) or len(shape) > 8 or not all(isinstance(d, int) for d in shape):
        return channel.MAX_TENSOR_NUMEL + 1
    for d in shape:
        claimed = min(claimed * max(d, 0), 1 << 62)
    return max(claimed, len(encoded.get("data", "")) * 3 // 32)


def _tensor(encoded):
    return None if encoded is None else {"shape": encoded["shape"], "dtype": str(encoded.get("dtype", ""))[:20],
                                         "data": encoded.get("data", "")}


def _error(error):
    return None if error is None else ErrorInfo(error.exception[:EXCEPTION], error.traceback[-TRACEBACK:])


def _call(call) -> dict:
    numel = call.get("numel")
    kept = {"op": str(call.get("op"))[:40], "numel": numel if isinstance(numel, int) else 0,
            "reduce_op": None if call.get("reduce_op") is None else str(call.get("reduce_op"))[:20]}
    if call.get("raised") is True:
        kept["raised"] = True
    return kept


def _calls(calls: list, part: str, check: dict, world_size: int) -> list:
    """A rank's record of its collectives, each within bounds, and the values it handed them
    (`sent`, base64 float32) within the part's budget (grader.parts.sent_budget) in all."""
    kept_values = sum(sent_budget(part, check, world_size).values()) // sent_stride(part, check, world_size) + COMM
    kept, room = [], 4 * ((4 * kept_values + 2) // 3)   # that many float32 values, in base64
    for call in (c for c in calls[:COMM] if isinstance(c, dict)):
        kept.append(_call(call))
        sent = call.get("sent")
        if isinstance(sent, str) and 0 < len(sent) <= room:
            kept[-1]["sent"], room = sent, room - len(sent)
    return kept


def hold(result: Result, check: dict, world_size: int) -> Result:
    """A rank's Result, as the supervisor keeps it: its tensors within what its part may return (a
    larger one: the part crashed on that rank, `oversize` its values), its words within bounds."""
    extra = dict(list(result.extra.items())[:EXTRAS])
    over = max([_values(result.weight)] + [_values(t) for t in extra.values()])
    if over > allowed(result.part, check) or result.oversize:
        result.status, result.weight, extra = RankStatus.CRASHED, None, {}
        result.oversize = min(max(over, result.oversize, 1), 1 << 62)
    result.weight = _tensor(result.weight)
    result.extra = {str(name)[:40]: _tensor(t) for name, t in extra.items()}
    result.error = _error(result.error)
    result.comm = _calls(result.comm, result.part, check, world_size)
    result.devices = [d for d in result.devices[:DEVICES] if isinstance(d, int)]
    return result


def _body(value) -> bytes:
    return channel.body_of(protocol.encode(value) if hasattr(value, "TYPE") else value)


def fit(message):
    """A world's report (anything else as it is) that fits one frame: its texts cut to their
    bounds; if it is still too large, the compiled code left out (the next world compiles again),
    then, while it is, the part whose results take the most refused on every rank (as `hold`
    refuses a tensor), one part at a time: never the whole report."""
    return _fit(message)[0]


def fitted_body(message) -> bytes:
    """The frame body (channel.body_of) of `fit(message)`: a report is sent as the body that last
    measured it, encoded once where it fits as it is (the common case)."""
    fitted, body = _fit(message)
    return _body(fitted) if body is None else body


def _fit(message) -> tuple:
    """(fit's message, the body its last measure encoded; None for a message that is not a report)."""
    if not isinstance(message, WorldReport):
        return message, None
    report = message
    report.skipped_lines = report.skipped_lines[:SKIPPED]
    if report.abort is not None:
        report.abort.detail = report.abort.detail[:DETAIL]
        report.abort.error = _error(report.abort.error)
    body = _body(report)
    if len(body) > REPORT_BYTES and report.compiled:
        report.compiled = ""
        body = _body(report)
    if len(body) <= REPORT_BYTES:
        return report, body   # the common case: one encoding to measure and send it, none of each part's
    sizes = {part: len(_body({str(r): protocol.encode(m) for r, m in ranks.items()}))
             for part, ranks in report.results.items()}
    for part in sorted(sizes, key=sizes.get, reverse=True):
        if len(body) <= REPORT_BYTES:
            break
        for result in report.results[part].values():
            values = max([_values(result.weight)] + [_values(t) for t in result.extra.values()])
            result.status, result.weight, result.extra = RankStatus.CRASHED, None, {}
            result.oversize = values or result.oversize
        body = _body(report)
    return report, body


def refusal(part: str, values: int, check: dict, hidden: bool) -> str:
    """What a student reads of a part that returned a tensor larger than it may: its size and the
    size it should have at a public check, no size at a hidden one."""
    should = BY_ID[part].should(check, kind_of(check), hidden)
    size = "a tensor larger than any it may return" if hidden else f"a tensor of {values} values"
    return f"the part returned {size}; it should return {should}"


def explain(runs: dict, check: dict, hidden: bool, crashed) -> None:
    """Part id -> grader.rerun.check.PartRun: a part a rank returned too large a tensor from has
    crashed (`crashed`: grader.results.Status's, which no module a rank imports loads), and says so
    in the grader's words (`refusal`), whatever the ranks said."""
    for part, run in runs.items():
        over = max([r.oversize for r in run.ranks.values()], default=0)
        if over:
            run.status, run.detail = crashed, refusal(part, over, check, hidden)
            for r in run.ranks.values():
                r.exception, r.traceback = (run.detail, "") if r.oversize else (r.exception, r.traceback)
