"""The catalogue: every idiom variant the oracle's scripts are composed from, one named entry each.

Each axis is a dict ``{variant_name: Idiom}`` whose *first* entry is the axis's simplest variant
(what the shrinker falls back to). An ``Idiom`` maps slot names to small functions of the
composition context :class:`Ctx` that return lines of code; generate.py decides where each slot
lands in the script. All idioms are written from how real training scripts spell these things
(pytorch/examples, HF course loops, Kaggle notebooks), but small enough to run in milliseconds on
one CPU: 96 training and 48 test samples of 16 features (or 1x8x8 images), batches of 8, 2 epochs.

The dataset sizes are what lets the oracle tell the training set from the test set when it
records which samples a run fetched, and they divide evenly into 2 processes' batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Lines = list[str]
Idiom = dict[str, Callable[..., Lines]]

TRAIN_SIZE = 96
TEST_SIZE = 48
BATCH_SIZE = 8

# Names the training objects go by; inside the Trainer class they are attributes of self.
_SHARED = """args model enc dec optimizer scheduler criterion device use_cuda device_type offset
class_weights train_loader test_loader x_train y_train x_test y_test epochs accum_steps"""
SHARED_ORDER = tuple(_SHARED.split())
SHARED = frozenset(SHARED_ORDER)
BATCH_LOOPS = frozenset({"enumerate_batch", "iter_while", "iter_for"})  # bind `batch`, then unpack
LOOP_INDEX = {
    "enumerate_xy": "i",
    "enumerate_batch": "step",
    "zip_range": "step",
    "iter_while": "step",
    "iter_for": "step",
}


def indent(lines: Lines, levels: int = 1) -> Lines:
    return [("    " * levels + line) if line else line for line in lines]


def block(header: str, body: Lines) -> Lines:
    return [header, *indent(body or ["pass"])]


@dataclass(frozen=True)
class Ctx:
    """One script's variant choices, and the names and expressions they imply."""

    choice: Mapping[str, str]
    in_class: bool = False  # rendering Trainer methods: shared objects are self.<name>

    def v(self, axis: str) -> str:
        return self.choice[axis]

    def n(self, name: str) -> str:
        return f"self.{name}" if self.in_class and name in SHARED else name

    def part(self, axis: str, slot: str, *args: Any) -> Lines:
        """The lines variant ``choice[axis]`` gives for ``slot`` (none when it has no such slot)."""
        fn = AXES[axis][self.v(axis)].get(slot)
        return fn(self, *args) if fn else []

    def has(self, axis: str, slot: str) -> bool:
        return slot in AXES[axis][self.v(axis)]

    @property
    def xy(self) -> tuple[str, str]:
        return BATCH_NAMES[self.v("batch_names")]

    @property
    def models(self) -> list[str]:
        return [self.n("enc"), self.n("dec")] if self.v("arch") == "enc_dec" else [self.n("model")]

    @property
    def model(self) -> str:
        return self.n("model")

    def forward(self, x: str) -> str:
        if self.v("arch") == "enc_dec":
            return f"{self.n('dec')}({self.n('enc')}({x}))"
        aliased = self.choice.get("alias") == "forward_alias"
        called = f"net({x})" if aliased else f"{self.model}({x})"
        if self.v("model_extra") == "start_logits":  # an init_hidden: sized, with no weights
            return f"{called} + {self.model}.start_logits({x}.size(0))"
        return called

    @property
    def params(self) -> str:
        if self.v("arch") == "enc_dec":
            return f"list({self.n('enc')}.parameters()) + list({self.n('dec')}.parameters())"
        return f"{self.model}.parameters()"

    @property
    def argparse(self) -> bool:
        return self.v("argparse") == "argparse"

    @property
    def epochs(self) -> str:
        return f"{self.n('args')}.epochs" if self.argparse else self.n("epochs")

    @property
    def lr(self) -> str:
        if self.argparse:
            return f"{self.n('args')}.lr"
        return "0.01" if self.v("optimizer").startswith("adam") else "0.05"

    @property
    def accum(self) -> str | None:
        if self.v("accum") == "none":
            return None
        return {"name": self.n("accum_steps"), "args": f"{self.n('args')}.accum", "literal": "3"}[
            self.v("accum_n")
        ]

    @property
    def idx(self) -> str | None:
        return LOOP_INDEX.get(self.v("loop"))

    @property
    def regress(self) -> bool:
        return self.v("loss") == "mse"

    @property
    def shape(self) -> str:
        return "1, 8, 8" if self.v("arch") == "conv" else "16"

    @property
    def classes(self) -> int:
        return 1 if self.regress else 4

    @property
    def binds_batch(self) -> bool:
        return self.v("loop") in BATCH_LOOPS

    @property
    def steps_per_epoch(self) -> str:
        steps = f"len({self.n('train_loader')})"
        return f"{steps} // {self.accum}" if self.accum else steps


# ----------------------------------------------------------------------------------------------
# Where the code lives. A layout gets the script's pieces (generate.Pieces) and arranges them.


def _module(c: Ctx, p: Any) -> Lines:
    return [*p.functions(c), *p.main_lines(c)]


def _main_func(c: Ctx, p: Any) -> Lines:
    return [
        *p.module_globals(c),
        *p.functions(c),
        *block("def main():", p.main_lines(c)),
        "",
        "",
        *block('if __name__ == "__main__":', ["main()"]),
    ]


def _if_main(c: Ctx, p: Any) -> Lines:
    return [*p.functions(c), *block('if __name__ == "__main__":', p.main_lines(c))]


def _helpers(c: Ctx, p: Any) -> Lines:
    return _main_func(c, p)  # the same shape; Pieces moves the epoch's loop into train()


def _trainer_class(c: Ctx, p: Any) -> Lines:
    return p.trainer_class(c)


def _trainer_factory(c: Ctx, p: Any) -> Lines:
    return p.trainer_factory(c)


def _trainer_optimizer(c: Ctx, p: Any) -> Lines:
    return p.trainer_optimizer(c)


SCOPE: dict[str, Idiom] = {
    "module": {"layout": _module},
    "main_func": {"layout": _main_func},
    "if_main": {"layout": _if_main},
    "helpers": {"layout": _helpers},
    "trainer_class": {"layout": _trainer_class},
    "trainer_factory": {"layout": _trainer_factory},
    "trainer_optimizer": {"layout": _trainer_optimizer},
}

ARGPARSE: dict[str, Idiom] = {
    "none": {"setup": lambda c: [f"{c.n('epochs')} = 2"]},
    "argparse": {
        "imports": lambda c: ["import argparse"],
        "prelude": lambda c: [
            'parser = argparse.ArgumentParser(description="toy classifier")',
            'parser.add_argument("--epochs", type=int, default=2)',
            'parser.add_argument("--lr", type=float, default=0.05)',
            'parser.add_argument("--accum", type=int, default=2)',
            'parser.add_argument("--no-cuda", action="store_true", default=False)',
            'parser.add_argument("--seed", type=int, default=0)',
            'parser.add_argument("--arch", default="mlp", choices=["mlp", "linear"])',
            "args = parser.parse_args()",
        ],
    },
}

BANNER: dict[str, Idiom] = {
    "none": {},
    "print_start": {"prelude": lambda c: ['print("start")']},
    "print_args": {"prelude": lambda c: ["print(args)"]},
}

SEED: dict[str, Idiom] = {
    "torch": {"prelude": lambda c: ["torch.manual_seed(0)"]},
    "random_torch": {
        "imports": lambda c: ["import random"],
        "prelude": lambda c: ["random.seed(0)", "torch.manual_seed(0)"],
    },
    "numpy_torch": {
        "imports": lambda c: ["import numpy as np"],
        "prelude": lambda c: ["np.random.seed(0)", "torch.manual_seed(0)"],
    },
    "all_three": {
        "imports": lambda c: ["import random", "import numpy as np"],
        "prelude": lambda c: ["random.seed(0)", "np.random.seed(0)", "torch.manual_seed(0)"],
    },
    "cuda_all": {"prelude": lambda c: ["torch.manual_seed(0)", "torch.cuda.manual_seed_all(0)"]},
    "args_seed": {"prelude": lambda c: ["torch.manual_seed(args.seed)"]},
}


def _use_cuda_if_needed(c: Ctx) -> Lines:
    guarded = c.v("move") == "cuda_guard" or c.v("model_move") == "cuda_guard"
    return [f"{c.n('use_cuda')} = torch.cuda.is_available()"] if guarded else []


DEVICE: dict[str, Idiom] = {
    "cpu_str": {"setup": lambda c: [*_use_cuda_if_needed(c), f'{c.n("device")} = "cpu"']},
    "torch_device_cond": {
        "setup": lambda c: [
            *_use_cuda_if_needed(c),
            f'{c.n("device")} = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        ]
    },
    "str_cond": {
        "setup": lambda c: [
            *_use_cuda_if_needed(c),
            f'{c.n("device")} = "cuda" if torch.cuda.is_available() else "cpu"',
        ]
    },
    "use_cuda_flag": {
        "setup": lambda c: [
            f"{c.n('use_cuda')} = not {c.n('args')}.no_cuda and torch.cuda.is_available()",
            f'{c.n("device")} = torch.device("cuda" if {c.n("use_cuda")} else "cpu")',
        ]
    },
    "if_branch": {
        "setup": lambda c: [
            *_use_cuda_if_needed(c),
            "if torch.cuda.is_available():",
            f'    {c.n("device")} = torch.device("cuda")',
            "else:",
            f'    {c.n("device")} = torch.device("cpu")',
        ]
    },
    "torch_accelerator": {
        "setup": lambda c: [
            *_use_cuda_if_needed(c),
            f"{c.n('device')} = (",
            "    torch.accelerator.current_accelerator()",
            "    if torch.accelerator.is_available()",
            '    else torch.device("cpu")',
            ")",
        ]
    },
}


# Where the device is chosen: in the setup, or once at module level, where the functions of a
# script with main() read it as a global (the layout of many segmentation and GAN repositories).
DEVICE_AT: dict[str, Idiom] = {"setup": {}, "module": {}}


# ----------------------------------------------------------------------------------------------
# Data: tensors drawn with a fixed seed, wrapped in datasets and loaders.


def _draw(c: Ctx, n: int, gen: str) -> Lines:
    x, y = ("x_train", "y_train") if n == TRAIN_SIZE else ("x_test", "y_test")
    if c.v("data") == "manual":  # the loops read the tensors themselves
        x, y = c.n(x), c.n(y)
    label = (
        f"{x}.flatten(1).mean(dim=1, keepdim=True)"
        if c.regress
        else f"{x}.flatten(1)[:, :4].argmax(dim=1)"
    )
    return [f"{x} = torch.randn({n}, {c.shape}{gen})", f"{y} = {label}"]


def _tensors(c: Ctx) -> Lines:
    if c.v("data_rng") == "generator":
        return [
            "g = torch.Generator().manual_seed(1)",
            *_draw(c, TRAIN_SIZE, ", generator=g"),
            *_draw(c, TEST_SIZE, ", generator=g"),
        ]
    return [*_draw(c, TRAIN_SIZE, ""), *_draw(c, TEST_SIZE, "")]


def _loaders(c: Ctx, dataset: str) -> Lines:
    shuffle = ", shuffle=True" if c.v("loader") == "shuffle" else ""
    return [
        f"train_set = {dataset}(x_train, y_train)",
        f"test_set = {dataset}(x_test, y_test)",
        f"{c.n('train_loader')} = DataLoader(train_set, batch_size={BATCH_SIZE}{shuffle})",
        f"{c.n('test_loader')} = DataLoader(test_set, batch_size={BATCH_SIZE})",
    ]


def _dict_dataset(c: Ctx) -> Lines:
    x, y = c.xy
    return [
        "class PairDataset(Dataset):",
        "    def __init__(self, inputs, targets):",
        "        self.inputs = inputs",
        "        self.targets = targets",
        "",
        "    def __len__(self):",
        "        return len(self.inputs)",
        "",
        "    def __getitem__(self, i):",
        f'        return {{"{x}": self.inputs[i], "{y}": self.targets[i]}}',
    ]


DATA: dict[str, Idiom] = {
    "tensor": {
        "imports": lambda c: ["from torch.utils.data import DataLoader, TensorDataset"],
        "setup": lambda c: [*_tensors(c), *_loaders(c, "TensorDataset")],
    },
    "dict": {
        "imports": lambda c: ["from torch.utils.data import DataLoader, Dataset"],
        "classes": _dict_dataset,
        "setup": lambda c: [*_tensors(c), *_loaders(c, "PairDataset")],
    },
    # No DataLoader at all: the script slices its tensors (what the converter cannot shard).
    "manual": {"setup": _tensors},
}

DATA_RNG: dict[str, Idiom] = {"generator": {}, "global": {}}  # read by _tensors
LOADER: dict[str, Idiom] = {"plain": {}, "shuffle": {}}  # read by _loaders


# ----------------------------------------------------------------------------------------------
# Models.


def _net(c: Ctx, name: str, layers: Lines, encode: str, head: str) -> Lines:
    """A custom module; ``encode`` maps x to features, ``head`` maps features to outputs."""
    extra = c.v("model_extra")
    returns_loss = c.v("loss") == "model_returns"
    lines = [
        f"class {name}(nn.Module):",
        f"    def __init__(self, num_classes={c.classes}):",
        "        super().__init__()",
        "        self.num_classes = num_classes",
        *indent(layers, 2),
        "",
    ]
    if extra == "encode":
        lines += ["    def encode(self, x):", f"        return {encode}", ""]
        features = "self.encode(x)"
    else:
        features = encode
    if returns_loss:
        loss_fn = "F.mse_loss" if c.regress else "F.cross_entropy"
        lines += [
            "    def forward(self, x, y=None):",
            f"        logits = {head.format(features)}",
            "        if y is None:",
            "            return logits",
            f"        return logits, {loss_fn}(logits, y)",
        ]
    else:
        lines += ["    def forward(self, x):", f"        return {head.format(features)}"]
    if extra in ("predict", "sample_in_step"):
        lines += ["", "    def predict(self, x):", "        return self.forward(x).argmax(dim=1)"]
    if extra == "start_logits":
        lines += [
            "",
            "    def start_logits(self, n):",
            "        return torch.zeros(n, self.num_classes)",
        ]
    return lines


def _mlp(c: Ctx, name: str = "Net") -> Lines:
    return _net(
        c,
        name,
        ["self.fc1 = nn.Linear(16, 32)", "self.fc2 = nn.Linear(32, num_classes)"],
        "F.relu(self.fc1(x))",
        "self.fc2({})",
    )


def _linear(c: Ctx, name: str = "Net") -> Lines:
    return _net(c, name, ["self.fc = nn.Linear(16, num_classes)"], "x.flatten(1)", "self.fc({})")


def _conv(c: Ctx) -> Lines:
    return _net(
        c,
        "Net",
        [
            "self.conv = nn.Conv2d(1, 4, 3, padding=1)",
            "self.fc = nn.Linear(4 * 8 * 8, num_classes)",
        ],
        "F.relu(self.conv(x)).flatten(1)",
        "self.fc({})",
    )


def _enc_dec(c: Ctx) -> Lines:
    return [
        "class Encoder(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.fc = nn.Linear(16, 32)",
        "",
        "    def forward(self, x):",
        "        return F.relu(self.fc(x))",
        "",
        "",
        "class Decoder(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        f"        self.fc = nn.Linear(32, {c.classes})",
        "",
        "    def forward(self, h):",
        "        return self.fc(h)",
    ]


def _build(c: Ctx, ctor: str, name: str | None = None) -> Lines:
    """``name = ctor``, chained with ``.to(device)`` when the model_move variant says so."""
    chained = f".to({c.n('device')})" if c.v("model_move") == "chained_ctor" else ""
    return [f"{name or c.model} = {ctor}{chained}"]


ARCH: dict[str, Idiom] = {
    "linear": {"classes": _linear, "build": lambda c: _build(c, "Net()")},
    "mlp": {"classes": _mlp, "build": lambda c: _build(c, "Net()")},
    "conv": {"classes": _conv, "build": lambda c: _build(c, "Net()")},
    "arch_branch": {
        "classes": lambda c: [*_mlp(c, "MLPNet"), "", "", *_linear(c, "LinearNet")],
        "build": lambda c: [
            f'if {c.n("args")}.arch == "mlp":',
            *indent(_build(c, "MLPNet()")),
            "else:",
            *indent(_build(c, "LinearNet()")),
        ],
    },
    "enc_dec": {
        "classes": _enc_dec,
        "build": lambda c: [
            *_build(c, "Encoder()", c.n("enc")),
            *_build(c, "Decoder()", c.n("dec")),
        ],
    },
    "sequential": {
        "build": lambda c: _build(
            c, f"nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, {c.classes}))"
        )
    },
}

# What the evaluation does with the model besides calling it (read by the eval pieces).
MODEL_EXTRA: dict[str, Idiom] = {
    "none": {},
    "predict": {},  # pred = model.predict(x)
    "encode": {},  # feature norms from model.encode(x)
    "num_classes": {},  # per-class counts sized by model.num_classes
    "start_logits": {},  # the training adds model.start_logits(n), zeros like an init_hidden
    "sample_in_step": {},  # the training step draws sample = model.predict(x[:2]), used by nothing
}

MODEL_MOVE: dict[str, Idiom] = {
    "none": {},
    "stmt": {"after_build": lambda c: [f"{m}.to({c.n('device')})" for m in c.models]},
    "assign": {"after_build": lambda c: [f"{m} = {m}.to({c.n('device')})" for m in c.models]},
    "chained_ctor": {},  # read by _build
    "chained_train": {
        "after_build": lambda c: [f"{m}.to({c.n('device')}).train()" for m in c.models]
    },
    "cuda_guard": {
        "after_build": lambda c: [f"if {c.n('use_cuda')}:", *[f"    {m}.cuda()" for m in c.models]]
    },
}

TRAIN_MODE: dict[str, Idiom] = {
    "none": {},
    "per_epoch": {"epoch_start": lambda c: [f"{m}.train()" for m in c.models]},
}


# ----------------------------------------------------------------------------------------------
# The loss, and what feeds it.


def _loss(c: Ctx, expr: str) -> Lines:
    x, _ = c.xy
    lines = [f"output = {c.forward(x)}", f"loss = {expr}{_inline_div(c)}"]
    if c.v("model_extra") == "sample_in_step":  # a sample drawn for its value, kept from the loss
        lines.append(f"sample = {c.model}.predict({x}[:2])")
    return lines


def _inline_div(c: Ctx) -> str:
    return f" / {c.accum}" if c.v("accum") == "inline_div" else ""


def _criterion(c: Ctx, cls: str) -> Lines:
    weight = f"weight={c.n('class_weights')}" if c.v("extra_tensor") == "class_weights" else ""
    return [f"{c.n('criterion')} = nn.{cls}({weight})"]


LOSS: dict[str, Idiom] = {
    "ce_module": {
        "setup": lambda c: _criterion(c, "CrossEntropyLoss"),
        "compute": lambda c: _loss(c, f"{c.n('criterion')}(output, {c.xy[1]})"),
    },
    "f_cross_entropy": {"compute": lambda c: _loss(c, f"F.cross_entropy(output, {c.xy[1]})")},
    "nll_log_softmax": {
        "compute": lambda c: _loss(c, f"F.nll_loss(F.log_softmax(output, dim=1), {c.xy[1]})")
    },
    "mse": {
        "setup": lambda c: _criterion(c, "MSELoss"),
        "compute": lambda c: _loss(c, f"{c.n('criterion')}(output, {c.xy[1]})"),
    },
    "model_returns": {"compute": lambda c: [f"output, loss = {c.model}({c.xy[0]}, {c.xy[1]})"]},
}

EXTRA_TENSOR: dict[str, Idiom] = {
    "none": {},
    # A tensor the script makes and moves itself: the converter must leave `device` working.
    "input_offset": {
        "setup": lambda c: [f"{c.n('offset')} = torch.zeros({c.shape}).to({c.n('device')})"],
        "use": lambda c: [f"{c.xy[0]} = {c.xy[0]} + {c.n('offset')}"],
    },
    "class_weights": {
        "setup": lambda c: [f"{c.n('class_weights')} = torch.ones(4).to({c.n('device')})"]
    },
}

OPTIMIZER: dict[str, Idiom] = {
    "sgd": {"setup": lambda c: [f"{c.n('optimizer')} = torch.optim.SGD({c.params}, lr={c.lr})"]},
    "sgd_momentum": {
        "setup": lambda c: [
            f"{c.n('optimizer')} = torch.optim.SGD({c.params}, lr={c.lr}, momentum=0.9)"
        ]
    },
    "adam": {"setup": lambda c: [f"{c.n('optimizer')} = torch.optim.Adam({c.params}, lr={c.lr})"]},
    "adamw": {
        "setup": lambda c: [
            f"{c.n('optimizer')} = torch.optim.AdamW({c.params}, lr={c.lr}, weight_decay=0.01)"
        ]
    },
}


def _sched_step(c: Ctx) -> Lines:
    return [f"{c.n('scheduler')}.step()"]


SCHEDULER: dict[str, Idiom] = {
    "none": {},
    "steplr_epoch": {
        "imports": lambda c: ["from torch.optim.lr_scheduler import StepLR"],
        "setup": lambda c: [
            f"{c.n('scheduler')} = StepLR({c.n('optimizer')}, step_size=1, gamma=0.7)"
        ],
        "epoch_after": _sched_step,
    },
    "onecycle_batch": {
        "setup": lambda c: [
            f"{c.n('scheduler')} = torch.optim.lr_scheduler.OneCycleLR(",
            f"    {c.n('optimizer')}, max_lr={c.lr}, total_steps={c.epochs} * "
            f"({c.steps_per_epoch})",
            ")",
        ],
        "optimizer_step": _sched_step,
    },
    "lambdalr_batch": {
        "imports": lambda c: ["from torch.optim.lr_scheduler import LambdaLR"],
        "setup": lambda c: [
            f"total_steps = {c.epochs} * ({c.steps_per_epoch})",
            f"{c.n('scheduler')} = LambdaLR({c.n('optimizer')}, "
            "lambda s: max(0.0, 1.0 - s / total_steps))",
        ],
        "optimizer_step": _sched_step,
    },
}


# ----------------------------------------------------------------------------------------------
# The training loop. Loop slots take the body (lines that see the batch as x, y) and wrap it.


def _iterable(c: Ctx) -> str:
    loader = c.n("train_loader")
    return f'tqdm({loader}, desc=f"epoch {{epoch}}")' if c.v("progress") == "tqdm" else loader


def _dict_keys_unpack(c: Ctx) -> Lines:
    return [f'{c.xy[0]}, {c.xy[1]} = batch["{c.xy[0]}"], batch["{c.xy[1]}"]']


def unpack(c: Ctx) -> Lines:
    """Bind x, y from ``batch`` (the move variant may move them as it unpacks)."""
    if c.has("move", "unpack"):
        return c.part("move", "unpack")
    return _dict_keys_unpack(c) if c.v("data") == "dict" else [f"{c.xy[0]}, {c.xy[1]} = batch"]


def _iter_while(c: Ctx, body: Lines) -> Lines:
    return [
        f"batches = iter({c.n('train_loader')})",
        "step = 0",
        *block(
            "while True:",
            [
                "try:",
                "    batch = next(batches)",
                "except StopIteration:",
                "    break",
                *unpack(c),
                *body,
                "step += 1",
            ],
        ),
    ]


def _iter_for(c: Ctx, body: Lines) -> Lines:
    loader = c.n("train_loader")
    return [
        f"batches = iter({loader})",
        *block(
            f"for step in range(len({loader})):",
            [
                "try:",
                "    batch = next(batches)",
                "except StopIteration:",
                "    break",
                *unpack(c),
                *body,
            ],
        ),
    ]


def _slices(c: Ctx, body: Lines) -> Lines:
    x, y = c.xy
    xs, ys = c.n("x_train"), c.n("y_train")
    return block(
        f"for i in range(0, len({xs}), {BATCH_SIZE}):",
        [f"{x}, {y} = {xs}[i : i + {BATCH_SIZE}], {ys}[i : i + {BATCH_SIZE}]", *body],
    )


LOOP: dict[str, Idiom] = {
    "for_xy": {"wrap": lambda c, b: block(f"for {', '.join(c.xy)} in {_iterable(c)}:", b)},
    "enumerate_xy": {
        "wrap": lambda c, b: block(f"for i, ({', '.join(c.xy)}) in enumerate({_iterable(c)}):", b)
    },
    "enumerate_batch": {
        "wrap": lambda c, b: block(
            f"for step, batch in enumerate({_iterable(c)}):", [*unpack(c), *b]
        )
    },
    "zip_range": {
        "wrap": lambda c, b: [
            f"steps_per_epoch = len({c.n('train_loader')})",
            *block(
                f"for step, ({', '.join(c.xy)}) in zip(range(steps_per_epoch), "
                f"{c.n('train_loader')}):",
                b,
            ),
        ]
    },
    "iter_while": {"wrap": _iter_while},
    "iter_for": {"wrap": _iter_for},
    "slices": {"wrap": _slices},  # only with data=manual
}

BATCH_NAMES = {
    "xy": ("x", "y"),
    "data_target": ("data", "target"),
    "inputs_labels": ("inputs", "labels"),
}
BATCH_NAMES_AXIS: dict[str, Idiom] = {name: {} for name in BATCH_NAMES}


def _to(c: Ctx, name: str) -> str:
    return f"{name}.to({c.n('device')})"


MOVE: dict[str, Idiom] = {
    "none": {},
    "tuple_to": {
        "moves": lambda c: [f"{c.xy[0]}, {c.xy[1]} = {_to(c, c.xy[0])}, {_to(c, c.xy[1])}"]
    },
    "separate_to": {"moves": lambda c: [f"{n} = {_to(c, n)}" for n in c.xy]},
    "list_comp": {"unpack": lambda c: [f"{c.xy[0]}, {c.xy[1]} = [{_to(c, 't')} for t in batch]"]},
    "dict_comp": {
        "unpack": lambda c: [
            f"batch = {{k: {_to(c, 'v')} for k, v in batch.items()}}",
            *_dict_keys_unpack(c),
        ]
    },
    "cuda_guard": {
        "moves": lambda c: [
            f"if {c.n('use_cuda')}:",
            f"    {c.xy[0]}, {c.xy[1]} = {c.xy[0]}.cuda(), {c.xy[1]}.cuda()",
        ]
    },
}


AMP: dict[str, Idiom] = {
    "none": {},
    "autocast_cpu": {"header": lambda c: ['with torch.autocast("cpu", dtype=torch.bfloat16):']},
    "autocast_device_type": {
        "setup": lambda c: [
            f'{c.n("device_type")} = "cuda" if "cuda" in str({c.n("device")}) else "cpu"'
        ],
        "header": lambda c: [
            f"with torch.autocast(device_type={c.n('device_type')}, dtype=torch.bfloat16):"
        ],
    },
    "amp_autocast": {
        "header": lambda c: ['with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):']
    },
}

ACCUM: dict[str, Idiom] = {
    "none": {"backward": lambda c: ["loss.backward()"]},
    "inline_div": {"backward": lambda c: ["loss.backward()"]},  # division read by _loss
    "reassign": {
        "after_loss": lambda c: [f"loss = loss / {c.accum}"],
        "backward": lambda c: ["loss.backward()"],
    },
    "augassign": {
        "after_loss": lambda c: [f"loss /= {c.accum}"],
        "backward": lambda c: ["loss.backward()"],
    },
    "backward_div": {"backward": lambda c: [f"(loss / {c.accum}).backward()"]},
    "div_method": {"backward": lambda c: [f"loss.div({c.accum}).backward()"]},
}

ACCUM_N: dict[str, Idiom] = {
    "name": {"setup": lambda c: [f"{c.n('accum_steps')} = 2"] if c.accum else []},
    "args": {},
    "literal": {},
}

ACCUM_GUARD: dict[str, Idiom] = {
    "modulo": {"guard": lambda c: [f"if ({c.idx} + 1) % {c.accum} == 0:"]},
    "modulo_or_last": {
        "guard": lambda c: [
            f"if ({c.idx} + 1) % {c.accum} == 0 or {c.idx} + 1 == len({c.n('train_loader')}):"
        ]
    },
}


def _zero(c: Ctx) -> Lines:
    if c.v("zero_grad") == "model_zero_grad":
        return [f"{c.model}.zero_grad()"]
    return [f"{c.n('optimizer')}.zero_grad()"]


ZERO_GRAD: dict[str, Idiom] = {
    "before_forward": {"before_forward": _zero},
    "after_step": {"after_step": _zero},
    "model_zero_grad": {"after_step": _zero},
}

CLIP: dict[str, Idiom] = {
    "none": {},
    "clip_norm": {"before_step": lambda c: [f"torch.nn.utils.clip_grad_norm_({c.params}, 1.0)"]},
}

LOG: dict[str, Idiom] = {
    "none": {},
    "epoch_print": {"epoch_end": lambda c: ['print(f"epoch {epoch} loss {loss.item():.4f}")']},
    "step_print": {
        "step_end": lambda c: [
            f"if {c.idx} % 4 == 0:",
            f'    print(f"epoch {{epoch}} step {{{c.idx}}} loss {{loss.item():.4f}}")',
        ]
    },
    # The (maybe divided) loss read again after backward.
    "running_loss": {
        "epoch_start": lambda c: ["running_loss = 0.0"],
        "after_backward": lambda c: ["running_loss += loss.item()"],
        "epoch_end": lambda c: ['print(f"epoch {epoch} running loss {running_loss:.4f}")'],
    },
}

PROGRESS: dict[str, Idiom] = {
    "none": {},
    "tqdm": {"imports": lambda c: ["from tqdm import tqdm"]},  # read by _iterable
}


def _epoch_while(c: Ctx, body: Lines) -> Lines:
    return ["epoch = 0", *block(f"while epoch < {c.epochs}:", [*body, "epoch += 1"])]


EPOCH_LOOP: dict[str, Idiom] = {
    "range": {"wrap": lambda c, b: block(f"for epoch in range({c.epochs}):", b)},
    "range1": {"wrap": lambda c, b: block(f"for epoch in range(1, {c.epochs} + 1):", b)},
    "while": {"wrap": _epoch_while},
}


# ----------------------------------------------------------------------------------------------
# Evaluation and saving.


def _eval_batches(c: Ctx, body: Lines) -> Lines:
    """Loop over the test data, with the batch moved the way the training loop moves it."""
    x, y = c.xy
    if c.v("data") == "manual":
        xs, ys = c.n("x_test"), c.n("y_test")
        return block(
            f"for i in range(0, len({xs}), {BATCH_SIZE}):",
            [
                f"{x}, {y} = {xs}[i : i + {BATCH_SIZE}], {ys}[i : i + {BATCH_SIZE}]",
                *c.part("move", "moves"),
                *body,
            ],
        )
    loader = c.n("test_loader")
    if c.binds_batch:
        return block(f"for batch in {loader}:", [*unpack(c), *c.part("move", "moves"), *body])
    return block(f"for {x}, {y} in {loader}:", [*c.part("move", "moves"), *body])


def evaluation(c: Ctx) -> tuple[Lines, str]:
    """Lines computing a metric over the test set, and the name holding it at the end."""
    x, y = c.xy
    extra = c.v("model_extra")
    per_batch = [*c.part("extra_tensor", "use")]
    if c.regress:
        start = ["total_loss = 0.0", "total = 0"]
        per_batch += [
            f"output = {c.forward(x)}",
            f'total_loss += F.mse_loss(output, {y}, reduction="sum").item()',
            f"total += {y}.size(0)",
        ]
        metric = ["mse = total_loss / total"]
        name = "mse"
    else:
        start = ["correct = 0", "total = 0"]
        if extra == "predict":
            per_batch += [f"pred = {c.model}.predict({x})"]
        else:
            per_batch += [f"output = {c.forward(x)}", "pred = output.argmax(dim=1)"]
        per_batch += [f"correct += (pred == {y}).sum().item()", f"total += {y}.size(0)"]
        metric = ["accuracy = correct / total"]
        name = "accuracy"
    if extra == "num_classes":
        start.append(f"per_class = torch.zeros({c.model}.num_classes)")
        per_batch.append(f"per_class += torch.bincount(pred, minlength={c.model}.num_classes)")
        metric.append('print(f"predicted per class {per_class.tolist()}")')
    if extra == "encode":
        start.append("feature_norm = 0.0")
        per_batch.append(f"feature_norm += {c.model}.encode({x}).norm().item()")
        metric.append('print(f"feature norm {feature_norm:.4f}")')
    lines = [
        *[f"{m}.eval()" for m in c.models],
        *start,
        *block("with torch.no_grad():", _eval_batches(c, per_batch)),
        *metric,
        *[f"{m}.train()" for m in c.models],
    ]
    return lines, name


def _print_metric(name: str) -> Lines:
    return [f'print(f"{name} {{{name}:.4f}}")']


EVAL: dict[str, Idiom] = {
    "none": {},
    "inline_final": {
        "finish": lambda c: [*evaluation(c)[0], *_print_metric(evaluation(c)[1])],
    },
    "inline_per_epoch": {
        "epoch_after": lambda c: [*evaluation(c)[0], *_print_metric(evaluation(c)[1])],
    },
    "function": {},  # generate.Pieces defines evaluate() (or Trainer.evaluate) and calls it
}


def _state(c: Ctx) -> str:
    if c.v("arch") == "enc_dec":
        return f'{{"enc": {c.n("enc")}.state_dict(), "dec": {c.n("dec")}.state_dict()}}'
    return f"{c.model}.state_dict()"


SAVE: dict[str, Idiom] = {
    "none": {},
    "state_dict": {"finish": lambda c: [f'torch.save({_state(c)}, "model.pt")']},
    "checkpoint": {
        "finish": lambda c: [
            "torch.save(",
            f'    {{"model": {_state(c)}, "optimizer": {c.n("optimizer")}.state_dict()}},',
            '    "checkpoint.pt",',
            ")",
        ]
    },
}

# The axes in the order generate.py chooses them (the most constraining first).
# ----------------------------------------------------------------------------------------------
# Other paths to the model, and what decides how long training goes on (issue: sound on code
# never seen). Each variant either converts right or must be refused with its reason.

ALIAS: dict[str, Idiom] = {
    "none": {},
    # An alias of the bare module read only for what the module itself answers: converts.
    "bare_alias": {
        "after_build": lambda c: [
            f"raw_model = {c.model}",
            "n_params = sum(p.numel() for p in raw_model.parameters())",
        ]
    },
    # The training step runs the model through an alias made before prepare(): refused.
    "forward_alias": {"after_build": lambda c: [f"net = {c.model}"]},
    # The model kept in a list: the list would keep the bare module: refused.
    "model_list": {"after_build": lambda c: [f"models = [{c.model}]", "print(len(models))"]},
}

# The model wrapped in nn.DataParallel (which, with no GPU, runs the module itself): the rewrite
# drops it and prepare() wraps the bare model.
WRAP: dict[str, Idiom] = {
    "none": {},
    "data_parallel_if_gpus": {
        "after_build": lambda c: [
            "if torch.cuda.device_count() > 1:",
            '    print("using", torch.cuda.device_count(), "GPUs")',
            *(f"    {m} = nn.DataParallel({m})" for m in c.models),
        ]
    },
    # mixup-cifar10's block: the move, the wrapper over every GPU and cuDNN's autotuner.
    "data_parallel_if_cuda_moved": {
        "after_build": lambda c: [
            "if torch.cuda.is_available():",
            *(
                line
                for m in c.models
                for line in (
                    f"    {m}.cuda()",
                    f"    {m} = nn.DataParallel({m}, device_ids=range(torch.cuda.device_count()))",
                )
            ),
            "    torch.backends.cudnn.benchmark = True",
        ]
    },
    "data_parallel": {"after_build": lambda c: [f"{m} = nn.DataParallel({m})" for m in c.models]},
}

STOP: dict[str, Idiom] = {
    "none": {},
    # Decided by the epoch counter, equal on every process: converts.
    "counter_break": {"after_epoch": lambda c: ["if epoch >= 1:", "    break"]},
    # Decided by the last batch's loss: refused where a prepared loader feeds it (each process
    # has its own batch); converted where every process trains on the same sliced tensors.
    "loss_break": {"after_epoch": lambda c: ["if loss.item() < 0.0:", "    break"]},
}


AXES: dict[str, dict[str, Idiom]] = {
    "scope": SCOPE,
    "loop": LOOP,
    "data": DATA,
    "move": MOVE,
    "batch_names": BATCH_NAMES_AXIS,
    "arch": ARCH,
    "loss": LOSS,
    "model_extra": MODEL_EXTRA,
    "extra_tensor": EXTRA_TENSOR,
    "accum": ACCUM,
    "accum_n": ACCUM_N,
    "accum_guard": ACCUM_GUARD,
    "zero_grad": ZERO_GRAD,
    "clip": CLIP,
    "scheduler": SCHEDULER,
    "amp": AMP,
    "device": DEVICE,
    "model_move": MODEL_MOVE,
    "train_mode": TRAIN_MODE,
    "optimizer": OPTIMIZER,
    "data_rng": DATA_RNG,
    "loader": LOADER,
    "epoch_loop": EPOCH_LOOP,
    "log": LOG,
    "progress": PROGRESS,
    "eval": EVAL,
    "save": SAVE,
    "seed": SEED,
    "banner": BANNER,
    "argparse": ARGPARSE,
    "alias": ALIAS,
    "stop": STOP,
    "device_at": DEVICE_AT,
    "wrap": WRAP,
}
