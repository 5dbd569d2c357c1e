"""Submit Assignment 4 to Slurm from Python (submitit), wait, and leave the sbatch job's logs.

    python -m slurm.submit --profile slurm/clusters/mycluster.yaml        # 4 nodes, as the profile says
    python -m slurm.submit --profile mycluster --nodes 2 --gpus-per-node 2
    python -m slurm.submit --profile mycluster --dry-run                  # the sbatch script and each node's torchrun
    python -m slurm.submit --local                                        # this machine, no Slurm: 4 ranks

Run it from the kit's top folder. It prints a progress line while the job waits and runs, then
leaves <name>-<jobid>.log and <name>-<jobid>.err in --out, in the form slurm/assignment4.sbatch
writes them. Exit status: 0 when the job completed, 1 when it failed (a rank crashed, it timed
out, it was cancelled: the message says which), 2 for bad input, 130 when interrupted (the job
is cancelled).
"""

import argparse
import inspect
import sys

from slurm.launch import LaunchError, dry_run, plan, progress_printer, run
from slurm.profile import ProfileError, profile_keys

DEFAULTS = {k: v.default for k, v in inspect.signature(plan).parameters.items()}


def build_parser() -> argparse.ArgumentParser:
    s = argparse.SUPPRESS   # options not given are not passed on: plan()'s defaults apply
    ap = argparse.ArgumentParser(prog="python -m slurm.submit", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=s, metavar="FILE",
                    help="cluster profile: a YAML file, or a name in slurm/clusters/ (default: the "
                         "settings of slurm/assignment4.sbatch)")
    ap.add_argument("--nodes", type=int, default=s, metavar="N", help=f"nodes (default: {DEFAULTS['nodes']})")
    ap.add_argument("--gpus-per-node", type=int, default=s, metavar="G",
                    help="GPUs per node, one rank each; 0: CPUs and gloo (default: the profile's)")
    ap.add_argument("--local", action="store_true", default=s,
                    help="run on this machine through submitit's local executor: one node with as "
                         "many ranks as the cluster run would have (without --profile: the handout's "
                         "4 ranks, on the CPU)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the sbatch script and the torchrun command each node runs; submit nothing")
    ap.add_argument("--script", default=s, metavar="PATH",
                    help=f"the script every rank runs (default: {DEFAULTS['script']})")
    ap.add_argument("--name", default=s, help=f"job name, and the logs' prefix (default: {DEFAULTS['name']})")
    ap.add_argument("--out", default=s, metavar="DIR", help="where the .log and .err go (default: here)")
    ap.add_argument("--folder", default=s, metavar="DIR",
                    help="submitit's working folder, %%j is the job id (default: build/submitit/%%j on "
                         "Slurm, on a file system the nodes share; with --local a temporary folder, removed "
                         "once the logs are written)")
    ap.add_argument("--help-profile", action="store_true", help="list the keys a profile may have")
    return ap


def parse_args(argv):
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    args = vars(parse_args(argv))
    dry, help_profile = args.pop("dry_run"), args.pop("help_profile")
    if help_profile:
        for key, (default, text) in profile_keys().items():
            print(f"{key:15} {text} (default: {default!r})")
        return 0
    try:
        p = plan(**args)
        if dry:
            print(dry_run(p), end="")
            return 0
        where = "this machine" if p.local else f"{p.nodes} nodes"
        print(f"[submit] {p.name}: {p.script} on {where}, {p.world_size} ranks", file=sys.stderr)
        result = run(p, progress=progress_printer(sys.stderr))
    except (ProfileError, LaunchError) as e:
        print(f"submit: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsubmit: interrupted; the job was cancelled", file=sys.stderr)
        return 130
    if result.ok:
        print(f"[submit] {result.message}")
        return 0
    print(f"submit: {result.message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
