"""A small family of generated scripts with several models and optimizers, judged by runner.py.

The main composition (idioms.py, generate.py) has one loss, one backward and one optimizer in
every slot (accumulation divides *the* loss, clipping clips *the* model, zero_grad zeroes *the*
optimizer), so GANs would need a rule against most of its axes. These scripts are composed from
their own few axes instead, and go through the same verdict (:func:`runner.judge`): bit-identical
losses and weights on one process, identical ranks and disjoint shards on two.

- ``shape``: how the optimizers alternate. ``dcgan``: D stepped on the real batch and on
  ``fake.detach()`` (two backwards), then G through the stepped D. ``joint_d``: D called on
  the real batch and on G's output (not detached) before one backward, a ``reset_grad()`` helper
  zeroing both optimizers. ``actor_critic``: two losses, ``backward(retain_graph=True)`` on the
  first, then both steps. ``enc_dec``: one loss through two models, one optimizer each.
  ``enc_dec_accum``: the same with the script's own gradient accumulation (N = 2).
- ``clip``: ``none`` or ``per_model`` (``clip_grad_norm_`` of each model before its step).
- ``zero``: ``optimizer`` or ``model`` (``opt.zero_grad()`` or ``net.zero_grad()``).
- ``shuffle``: whether the training loader shuffles.
"""

from __future__ import annotations

import itertools
import random

from idioms import BATCH_SIZE, TRAIN_SIZE, Lines, block

AXES: dict[str, tuple[str, ...]] = {
    "shape": ("dcgan", "joint_d", "actor_critic", "enc_dec", "enc_dec_accum"),
    "clip": ("none", "per_model"),
    "zero": ("optimizer", "model"),
    "shuffle": ("no", "yes"),
}
# Which model each optimizer trains, per shape (in the order the script steps them).
_PAIRS = {
    "dcgan": (("netD", "opt_d"), ("netG", "opt_g")),
    "joint_d": (("D", "d_optimizer"), ("G", "g_optimizer")),
    "actor_critic": (("actor", "actor_opt"), ("critic", "critic_opt")),
    "enc_dec": (("enc", "enc_opt"), ("dec", "dec_opt")),
    "enc_dec_accum": (("enc", "enc_opt"), ("dec", "dec_opt")),
}
_MODELS = {
    "dcgan": (
        "netD = nn.Sequential(nn.Linear(16, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())",
        "netG = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 16), nn.Tanh())",
    ),
    "actor_critic": (
        "actor = nn.Sequential(nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 3))",
        "critic = nn.Sequential(nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 1))",
    ),
    "enc_dec": ("enc = nn.Linear(16, 6)", "dec = nn.Linear(6, 16)"),
}
_MODELS["joint_d"] = tuple(m.replace("netD", "D").replace("netG", "G") for m in _MODELS["dcgan"])
_MODELS["enc_dec_accum"] = _MODELS["enc_dec"]


def variants() -> list[dict[str, str]]:
    """Every combination, in a fixed order."""
    return [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


def sample(seed: int) -> list[dict[str, str]]:
    """Each shape once, the clip variants taking turns, the other axes drawn so that every variant
    of every axis is in the sample (the sweep covers their combinations)."""
    rng = random.Random(seed)
    chosen: list[dict[str, str]] = []
    for shape, clip in zip(AXES["shape"], itertools.cycle(AXES["clip"])):
        choice = {"shape": shape, "clip": clip}
        choice.update({axis: rng.choice(AXES[axis]) for axis in ("zero", "shuffle")})
        chosen.append(choice)
    for axis in ("zero", "shuffle"):
        for value in AXES[axis]:
            if not any(c[axis] == value for c in chosen):
                chosen[rng.randrange(len(chosen))][axis] = value
    return chosen


def name(choice: dict[str, str]) -> str:
    return "_".join(choice[axis] for axis in AXES)


def render(choice: dict[str, str]) -> str:
    """The script for one combination."""
    shape = choice["shape"]
    shuffle = choice["shuffle"] == "yes"
    lines: Lines = [
        f"# several optimizers: {' '.join(f'{a}={v}' for a, v in choice.items())}",
        "import torch",
        "import torch.nn as nn",
        "",
        "torch.manual_seed(0)",
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        f"x_train = torch.randn({TRAIN_SIZE}, 16)",
        f"y_train = torch.randn({TRAIN_SIZE}, 16)",
        "train_loader = torch.utils.data.DataLoader(",
        "    torch.utils.data.TensorDataset(x_train, y_train),",
        f"    batch_size={BATCH_SIZE},",
        f"    shuffle={shuffle},",
        ")",
        *_MODELS[shape],
        *(f"{model} = {model}.to(device)" for model, _ in _PAIRS[shape]),
        *(
            f"{opt} = torch.optim.Adam({model}.parameters(), lr=0.01)"
            for model, opt in _PAIRS[shape]
        ),
        *_helpers(choice),
        *block("for epoch in range(2):", _BODIES[shape](choice)),
    ]
    return "\n".join(lines) + "\n"


def _zero(choice: dict[str, str], index: int) -> str:
    model, opt = _PAIRS[choice["shape"]][index]
    return f"{model if choice['zero'] == 'model' else opt}.zero_grad()"


def _clip(choice: dict[str, str], index: int) -> Lines:
    if choice["clip"] == "none":
        return []
    model = _PAIRS[choice["shape"]][index][0]
    return [f"torch.nn.utils.clip_grad_norm_({model}.parameters(), 0.5)"]


def _step(choice: dict[str, str], index: int) -> Lines:
    return [*_clip(choice, index), f"{_PAIRS[choice['shape']][index][1]}.step()"]


def _helpers(choice: dict[str, str]) -> Lines:
    if choice["shape"] != "joint_d":
        return []
    return ["", *block("def reset_grad():", [_zero(choice, 0), _zero(choice, 1)]), ""]


def _dcgan(c: dict[str, str]) -> Lines:
    return block(
        "for real, _ in train_loader:",
        [
            "real = real.to(device)",
            "ones = torch.ones(real.size(0), 1, device=device)",
            "zeros = torch.zeros(real.size(0), 1, device=device)",
            _zero(c, 0),
            "err_real = nn.functional.binary_cross_entropy(netD(real), ones)",
            "err_real.backward()",
            "fake = netG(torch.randn(real.size(0), 4, device=device))",
            "err_fake = nn.functional.binary_cross_entropy(netD(fake.detach()), zeros)",
            "err_fake.backward()",
            *_step(c, 0),
            _zero(c, 1),
            "err_g = nn.functional.binary_cross_entropy(netD(fake), ones)",
            "err_g.backward()",
            *_step(c, 1),
        ],
    )


def _joint_d(c: dict[str, str]) -> Lines:
    return block(
        "for i, (images, _) in enumerate(train_loader):",
        [
            "images = images.reshape(images.size(0), -1).to(device)",
            "real_labels = torch.ones(images.size(0), 1).to(device)",
            "fake_labels = torch.zeros(images.size(0), 1).to(device)",
            "d_loss_real = nn.functional.binary_cross_entropy(D(images), real_labels)",
            "fake_images = G(torch.randn(images.size(0), 4).to(device))",
            "d_loss_fake = nn.functional.binary_cross_entropy(D(fake_images), fake_labels)",
            "d_loss = d_loss_real + d_loss_fake",
            "reset_grad()",
            "d_loss.backward()",
            *_step(c, 0),
            "fake_images = G(torch.randn(images.size(0), 4).to(device))",
            "g_loss = nn.functional.binary_cross_entropy(D(fake_images), real_labels)",
            "reset_grad()",
            "g_loss.backward()",
            *_step(c, 1),
        ],
    )


def _actor_critic(c: dict[str, str]) -> Lines:
    return block(
        "for state, ret in train_loader:",
        [
            "state, ret = state.to(device), ret[:, 0].to(device)",
            "dist = torch.distributions.Categorical(logits=actor(state))",
            "action = dist.sample()",
            "value = critic(state).squeeze(-1)",
            "advantage = ret - value",
            "actor_loss = -(dist.log_prob(action) * advantage.detach()).mean()",
            "critic_loss = advantage.pow(2).mean()",
            _zero(c, 0),
            _zero(c, 1),
            "critic_loss.backward(retain_graph=True)",
            "actor_loss.backward()",
            *_clip(c, 0),
            *_clip(c, 1),
            f"{_PAIRS['actor_critic'][0][1]}.step()",
            f"{_PAIRS['actor_critic'][1][1]}.step()",
        ],
    )


def _enc_dec(c: dict[str, str]) -> Lines:
    return block(
        "for x, y in train_loader:",
        [
            "x, y = x.to(device), y.to(device)",
            _zero(c, 0),
            _zero(c, 1),
            "loss = nn.functional.mse_loss(dec(torch.tanh(enc(x))), y)",
            "loss.backward()",
            *_step(c, 0),
            *_step(c, 1),
        ],
    )


def _enc_dec_accum(c: dict[str, str]) -> Lines:
    return block(
        "for i, (x, y) in enumerate(train_loader):",
        [
            "x, y = x.to(device), y.to(device)",
            "loss = nn.functional.mse_loss(dec(torch.tanh(enc(x))), y) / 2",
            "loss.backward()",
            *block("if (i + 1) % 2 == 0:", [*_step(c, 0), *_step(c, 1), _zero(c, 0), _zero(c, 1)]),
        ],
    )


_BODIES = {
    "dcgan": _dcgan,
    "joint_d": _joint_d,
    "actor_critic": _actor_critic,
    "enc_dec": _enc_dec,
    "enc_dec_accum": _enc_dec_accum,
}
