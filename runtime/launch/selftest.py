"""What ``accel-run test`` runs on every process: a short training on the resolved config.

Like ``accelerate test``, it proves the launch works end to end before a real job is queued: every
rank joins once, each sees different batches, and after a few synchronised steps (through whatever
backend the config chose: DDP, DeepSpeed, FSDP) all ranks hold the same model. Any failed check
raises, so accel-run reports the rank and exits 1.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

from accelify.runtime import Accelerator


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"accel-run test failed: {what}")


def main() -> None:
    accelerator = Accelerator()
    device, processes = accelerator.device, accelerator.num_processes
    ranks = accelerator.gather(torch.tensor([accelerator.process_index], device=device))
    _check(sorted(ranks.tolist()) == list(range(processes)), f"ranks {ranks.tolist()} joined")

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    firsts = []
    for inputs, targets in loader:
        firsts.append(inputs[:1])
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs).float(), targets.float())
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    seen = accelerator.gather(firsts[0].float())
    _check(processes == 1 or not torch.equal(seen[0], seen[1]), "every rank got the same batches")
    outputs = accelerator.gather(model(torch.ones(1, 4, device=device)).detach().float())
    _check(torch.allclose(outputs, outputs[:1].expand_as(outputs)), "ranks hold different models")
    accelerator.print(
        f"accel-run test: ok: {processes} process(es), {accelerator.distributed_type.value}, "
        f"mixed precision {accelerator.mixed_precision}, device {device.type}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
