"""The sample TorchScript module's source (torch.jit.script reads it from this file)."""

from __future__ import annotations

import torch


class ImageNet(torch.nn.Module):
    """image float32[N,3,H,W] -> (probabilities float32[N,10], label int64[N])."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(image)).mean(dim=(2, 3))
        logits = self.fc(features)
        return torch.softmax(logits, dim=1), logits.argmax(dim=1)
