"""Re-run accel-convert over checkouts of public repositories and compare with reviewed verdicts.

    python tests/realcode/check.py ROOT [--verdicts tests/realcode/convert_verdicts.csv]

ROOT holds the checkouts, one folder per repository named ``owner+name`` (as the search tool's
``fetch`` names them). Each row of the verdicts file is one training script a person reviewed:
its path under ROOT, what the converter did with it then (``outcome``), the first line the report
points at, the reviewer's verdict and a one-line reason. No third-party code is kept here, only
these judgements. The command prints the table and exits 1 when the converter now does something
else with a script than what was reviewed (the verdict has to be looked at again), 0 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from accelify.transform.convert import Options, Result, convert
from accelify.transform.notebook import convert_notebook
from accelify.transform.project import convert_program, programs
from accelify.transform.sources import SourceError, read

HERE = Path(__file__).parent
VERDICTS = HERE / "convert_verdicts.csv"
# What the converter of ebb7962 did with repositories no one had reviewed before, judged before
# anything was changed for them: the rate users meet on code the project never studied.
FIRST_SIGHT = HERE / "first_sight.csv"
# The same for 13 repositories of LLM training code and tutorials, at 3d10904.
FIRST_SIGHT_LLM = HERE / "first_sight_llm_tutorials.csv"
# Project mode (a folder converted as programs) at 72641b6..50714d0 on four research repositories
# in DETR's layout, judged before anything was changed for them (their files were reviewed one
# at a time before, in FIRST_SIGHT).
FIRST_SIGHT_PROJECTS = HERE / "first_sight_projects.csv"
# Eight repositories of plain scripts and tutorials (pytorch-beginner, PyTorchZeroToAll,
# PyTorch-Mini-Tutorials, attention-is-all-you-need, Pytorch-UNet, SimCLR, sgrvinod's two
# tutorials), at 37d45c3: 45 files. Faults not fixed yet have no row in VERDICTS.
FIRST_SIGHT_PLAIN = HERE / "first_sight_plain.csv"
# Three more repositories of plain scripts (Kind-PyTorch-Tutorial, pytorch-book,
# Text-Classification-Pytorch), at 788aaef: 21 files.
FIRST_SIGHT_PLAIN_2 = HERE / "first_sight_plain_2.csv"
# Three more (aladdinpersson's Machine-Learning-Collection ML/Pytorch, dragen1860's course,
# pytorch/tutorials' beginner and intermediate sources), at d1908e0, reviewed by three helpers
# with one verdict corrected in review: 43 files.
FIRST_SIGHT_PLAIN_3 = HERE / "first_sight_plain_3.csv"
# Eight more (graykode's nlp-tutorial, zhangxiann's PyTorch_Practice, dlwpt-code,
# pytorch-cifar100, mixup-cifar10, cnn-text-classification-pytorch, bearpaw's
# pytorch-classification, TingsongYu's PyTorch_Tutorial), at d24115f, reviewed by three
# helpers: 54 files.
FIRST_SIGHT_PLAIN_4 = HERE / "first_sight_plain_4.csv"
# Fourteen more (spro's practical-pytorch, siamese-triplet, wide-resnet.pytorch,
# recurrent-visual-attention, densenet.pytorch, WideResNet-pytorch, pytorch-playground,
# fast_adversarial, PPO-PyTorch, pytorch-retinanet, efficient_densenet_pytorch, sweetice's
# Deep-reinforcement-learning-with-pytorch; DDP: Swin-Transformer, Deformable-DETR, LeViT), at
# 8b2c14b, two runs reviewed by helpers: 46 files.
FIRST_SIGHT_PLAIN_5 = HERE / "first_sight_plain_5.csv"
# Ten more (Image_Segmentation, SRGAN-PyTorch, bubbliiiing's unet-pytorch and yolov4-pytorch,
# deep-text-recognition-benchmark, PyTorch-YOLOv3, vit-pytorch, stargan; DDP: DiT, SiT), at
# f48b27c: 25 files.
FIRST_SIGHT_PLAIN_6 = HERE / "first_sight_plain_6.csv"
# Seven more (Time-Series-Library, TCN, awd-lstm-lm, vision-transformers-cifar10,
# pytorch_resnet_cifar10; DDP: ViT-pytorch, open_clip), at f48b27c: 24 files.
FIRST_SIGHT_PLAIN_7 = HERE / "first_sight_plain_7.csv"
# Seven more (Cutout, MixMatch, FixMatch, CutMix, pytorch-a2c-ppo-acktr-gail, Rainbow, RAdam),
# at f48b27c: 13 files.
FIRST_SIGHT_PLAIN_8 = HERE / "first_sight_plain_8.csv"
# Seventeen more (cleanrl, makemore, pygcn, pyGAT, SupContrast, RepDistiller, ssd.pytorch,
# pytorch-ddpm, pytorch-semseg, TD3, leftthomas' SimCLR, generative-model-collections,
# pytorch-soft-actor-critic, pytorch-openai-transformer-lm; DDP: stylegan2-pytorch,
# vq-vae-2-pytorch, semseg), at 00fbe8a, refusals reviewed by two helpers: 35 files.
FIRST_SIGHT_PLAIN_9 = HERE / "first_sight_plain_9.csv"
# Seventeen more (Beta-VAE, Spijkervet's SimCLR, pytorch-YOLOv4, DomainBed, pointnet.pytorch,
# Pointnet_Pointnet2_pytorch, augmix, outlier-exposure, pytorch_image_classification,
# faster-rcnn.pytorch, transformer-xl, pytorch-vqvae, the super-resolution tutorial,
# pytorch-vae, wide-residual-networks, swa, pytorch-template), at 65650ac, refusals reviewed by
# two helpers: 37 files.
FIRST_SIGHT_PLAIN_10 = HERE / "first_sight_plain_10.csv"
# Sixteen more (CSAILVision's semantic segmentation, Swin-Transformer-V2, open-reid,
# Dive-into-DL-PyTorch, face.evoLVe, bentrevett's image classification, pytorch-trpo,
# kuangliu's retinanet, lucidrains' stylegan2, eat_pytorch_in_20_days, ignite's examples,
# pytorch-custom-dataset-examples, BasicSR, zalandoresearch's vq-vae, two Lightning repositories),
# at d1a0ab0 (this session's converter, nothing fixed for them yet), refusals reviewed by two
# helpers: 37 files.
FIRST_SIGHT_PLAIN_11 = HERE / "first_sight_plain_11.csv"
# Seventeen more (BigGAN-PyTorch, DeepLabV3Plus, simple-faster-rcnn, ddim, PyTorch-BYOL,
# disentangling-vae, Self-Attention-GAN, leftthomas' SRGAN, pytorch-nested-unet,
# Chinese-Text-Classification, BERT-pytorch, Informer2020, NCF, gae-pytorch, RL-Adventure; DDP:
# vits, hifi-gan), at 21beb07 (the session's start), reviewed by two helpers: 32 files.
FIRST_SIGHT_PLAIN_12 = HERE / "first_sight_plain_12.csv"
# Eighteen more (U-2-Net, stargan-v2, monodepth2, HRNet pose, deep_sort_pytorch, yolact,
# ESRGAN-PyTorch, seq2seq, powerful-gnns, pytorch-fm, LightGCN, SASRec, NCRFpp, LSTNet,
# Prototypical Networks; DDP: awesome-semantic-segmentation, glow-tts, tacotron2), at e641d5b
# (after first sight 15's fixes, nothing fixed for them), reviewed by two helpers: 30 files.
FIRST_SIGHT_PLAIN_13 = HERE / "first_sight_plain_13.csv"
FIRST_SIGHTS = (
    FIRST_SIGHT,
    FIRST_SIGHT_LLM,
    FIRST_SIGHT_PROJECTS,
    FIRST_SIGHT_PLAIN,
    FIRST_SIGHT_PLAIN_2,
    FIRST_SIGHT_PLAIN_3,
    FIRST_SIGHT_PLAIN_4,
    FIRST_SIGHT_PLAIN_5,
    FIRST_SIGHT_PLAIN_6,
    FIRST_SIGHT_PLAIN_7,
    FIRST_SIGHT_PLAIN_8,
    FIRST_SIGHT_PLAIN_9,
    FIRST_SIGHT_PLAIN_10,
    FIRST_SIGHT_PLAIN_11,
    FIRST_SIGHT_PLAIN_12,
    FIRST_SIGHT_PLAIN_13,
)
# Project mode's verdicts: a script converted together with files beside it (``with``: paths
# relative to the script's folder, or ``*`` for every Python file under it, as
# ``accel-convert .`` run there).
PROJECT_VERDICTS = HERE / "project_verdicts.csv"
VERDICTS_ALLOWED = frozenset(
    {"correct-full", "correct-partial", "refused-with-reason", "unchanged-no-training"}
)
FIELDS = ["path", "outcome", "line", "verdict", "reason"]
# What a reviewer may conclude of today's converter; "wrong" and "silent" are never recorded as
# accepted: they are fixed first. A first sight records them as they were.
FAULTS = frozenset({"wrong", "silent", "refused-untrue-reason"})
OUTCOMES = frozenset(
    {"converted", "converted-with-notes", "unchanged-with-reason", "unchanged", "error"}
)


@dataclass(frozen=True)
class Row:
    path: str
    outcome: str
    line: int
    verdict: str
    reason: str
    others: tuple[str, ...] = ()  # project mode: the files given with it, beside it


def outcome(result: Result) -> tuple[str, int]:
    """What the converter did, in the words of the table, and the first line it reports on."""
    reasons = [n for n in result.notes if n.manual or n.info]
    first = min((n.line for n in reasons), default=0)
    if not result.changed:
        return ("unchanged-with-reason" if reasons else "unchanged"), first
    if any(n.manual for n in result.notes):
        return "converted-with-notes", first
    return "converted", first


def converted(file: Path) -> tuple[str, int]:
    """What the converter does with a script or a notebook (its code cells as one program), and
    the first line it reports on; ``error`` for a file it refuses to read (one line, exit 2)."""
    try:
        text = read(str(file)).text
        if file.suffix == ".ipynb":
            return outcome(convert_notebook(text, Options(), str(file)).program)
        return outcome(convert(text, path=str(file)))
    except SourceError:
        return "error", 0


def converted_with(file: Path, others: list[str]) -> tuple[str, int]:
    """What project mode does with the script ``file`` given with ``others`` (beside it)."""
    if others == ["*"]:
        others = [str(p.relative_to(file.parent)) for p in sorted(file.parent.rglob("*.py"))]
    paths = [str(file), *(str(file.parent / o) for o in others if file.parent / o != file)]
    found = [p for p in programs(paths) if p.script == str(file)]
    if not found:
        return converted(file)  # nothing joins: the script is converted alone
    (_source, result) = convert_program(found[0], Options())[str(file)]
    return ("error", 0) if isinstance(result, SourceError) else outcome(result)


def load(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        return [
            Row(
                r["path"],
                r["outcome"],
                int(r["line"]),
                r["verdict"],
                r["reason"],
                tuple(r.get("with", "").split()),
            )
            for r in csv.DictReader(handle)
        ]


def check(root: Path, rows: list[Row]) -> list[str]:
    """One message per script whose outcome moved since it was reviewed (or is not there)."""
    problems = []
    for row in rows:
        file = root / row.path
        if not file.exists():
            problems.append(f"{row.path}: not found under {root}")
            continue
        now, line = converted_with(file, list(row.others)) if row.others else converted(file)
        if (now, line) != (row.outcome, row.line):
            problems.append(
                f"{row.path}: reviewed as {row.outcome} (line {row.line}), now {now} "
                f"(line {line}): review it again"
            )
    return problems


def rates(first: list[Row], after: list[Row]) -> list[str]:
    """Per repository: files, and how many were wrong, silent or refused for an untrue reason at
    first sight and now (the after verdicts admit none)."""
    now = {r.path: r for r in after}
    lines = [f"{'repository':40} {'files':>5} {'faults first':>12} {'converted first':>15} "
             f"{'converted now':>13}"]  # fmt: skip
    repos = sorted({r.path.split("/", 1)[0] for r in first})
    for repo in repos:
        rows = [r for r in first if r.path.startswith(f"{repo}/")]
        later = [now[r.path] for r in rows if r.path in now]
        faults = sum(r.verdict in FAULTS for r in rows)
        done = sum(r.verdict.startswith("correct") for r in rows)
        done_now = sum(r.verdict.startswith("correct") for r in later)
        lines.append(f"{repo:40} {len(rows):5} {faults:12} {done:15} {done_now:13}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder holding the owner+name checkouts")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS)
    args = parser.parse_args(argv)
    rows = load(args.verdicts)
    table = Counter((r.path.split("/", 1)[0], r.verdict) for r in rows)
    for (repo, verdict), count in sorted(table.items()):
        print(f"{repo:40} {verdict:24} {count}")
    projects = load(PROJECT_VERDICTS)
    for first in FIRST_SIGHTS:
        after = projects if first == FIRST_SIGHT_PROJECTS else rows
        print(f"\n{first.name}:\n" + "\n".join(rates(load(first), after)))
    problems = check(args.root, rows) + check(args.root, projects)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
