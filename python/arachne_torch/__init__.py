"""arachne_torch: the PyTorch training engine of Arachne.

`python3 -m arachne_torch.engine` is what `arachne-agent` launches once per
GPU (its `--engine-command`); it serves the engine protocol
(`arachne.v1.Engine`, proto/arachne/v1/engine.proto) on the Unix socket the
agent names, and trains its rank of the job's plan with PyTorch
(docs/pytorch.md).
"""
