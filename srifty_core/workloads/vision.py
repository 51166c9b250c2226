"""Vision networks of the model zoo, written in torch (no torchvision, no downloads).

Architectures follow the torchvision reference definitions (ResNet18/50, VGG16, AlexNet,
Inception v3 without the auxiliary head, ShuffleNet v2 1.0x). ``width`` scales every channel
count so CPU tests can run narrow versions; ``width=1.0`` is the real network.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def _c(channels: int, width: float) -> int:
    """A channel count scaled by ``width`` (at least 4, a multiple of 2 for shuffles)."""
    return max(4, round(channels * width / 2.0) * 2)


# ----------------------------------------------------------------------------- ResNet
class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != planes:
            self.down = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.down(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, cin: int, planes: int, stride: int, groups: int = 1, base_width: int = 64
    ) -> None:
        super().__init__()
        out_ch = planes * 4
        mid = planes * base_width // 64 * groups  # ResNeXt: 32 groups of 4 at planes 64
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != out_ch:
            self.down = nn.Sequential(
                nn.Conv2d(cin, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + self.down(x))


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[_BasicBlock | _Bottleneck],
        layers: list[int],
        classes: int,
        width: float,
        groups: int = 1,
    ) -> None:
        super().__init__()
        c = _c(64, width)
        self.stem = nn.Sequential(
            nn.Conv2d(3, c, 7, 2, 3, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        stages: list[nn.Module] = []
        cin = c
        for i, n in enumerate(layers):
            planes = _c(64 * 2**i, width)
            blocks: list[nn.Module] = []
            for j in range(n):
                stride = 2 if (j == 0 and i > 0) else 1
                if groups > 1:  # ResNeXt's grouped bottleneck, 4 channels a group
                    blocks.append(_Bottleneck(cin, planes, stride, groups, base_width=4))
                else:
                    blocks.append(block(cin, planes, stride))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def resnet18(classes: int = 1000, width: float = 1.0) -> nn.Module:
    return ResNet(_BasicBlock, [2, 2, 2, 2], classes, width)


def resnet50(classes: int = 1000, width: float = 1.0) -> nn.Module:
    return ResNet(_Bottleneck, [3, 4, 6, 3], classes, width)


def resnext101_32x4d(classes: int = 1000, width: float = 1.0) -> nn.Module:
    """NVIDIA's ResNeXt101-32x4d (DeepLearningExamples' ConvNets): 32 groups of 4."""
    return ResNet(_Bottleneck, [3, 4, 23, 3], classes, width, groups=32)


# ----------------------------------------------------------------------------- VGG16 / AlexNet
_VGG16: list[int | str] = [
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
]


class VGG16(nn.Module):
    def __init__(self, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in _VGG16:
            if isinstance(v, str):
                layers.append(nn.MaxPool2d(2, 2))
            else:
                cout = _c(v, width)
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True)]
                cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = _c(4096, width)
        self.classifier = nn.Sequential(
            nn.Linear(cin * 49, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class AlexNet(nn.Module):
    def __init__(self, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3, c4 = (_c(n, width) for n in (64, 192, 384, 256))
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 11, 4, 2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c2, c3, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(c3, c4, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(c4, c4, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2),
        )
        self.pool = nn.AdaptiveAvgPool2d((6, 6))
        hidden = _c(4096, width)
        self.classifier = nn.Sequential(
            nn.Dropout(),
            nn.Linear(c4 * 36, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# ----------------------------------------------------------------------------- Inception v3
class _ConvBN(nn.Module):
    def __init__(self, cin: int, cout: int, k: int | tuple[int, int], **kw: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, bias=False, **kw)  # type: ignore[arg-type]
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


class _IncA(nn.Module):
    def __init__(self, cin: int, pool: int, w: float) -> None:
        super().__init__()
        self.b1 = _ConvBN(cin, _c(64, w), 1)
        self.b5 = nn.Sequential(
            _ConvBN(cin, _c(48, w), 1), _ConvBN(_c(48, w), _c(64, w), 5, padding=2)
        )
        self.b3 = nn.Sequential(
            _ConvBN(cin, _c(64, w), 1),
            _ConvBN(_c(64, w), _c(96, w), 3, padding=1),
            _ConvBN(_c(96, w), _c(96, w), 3, padding=1),
        )
        self.bp = _ConvBN(cin, _c(pool, w), 1)
        self.out = _c(64, w) * 2 + _c(96, w) + _c(pool, w)

    def forward(self, x: Tensor) -> Tensor:
        p = nn.functional.avg_pool2d(x, 3, 1, 1)
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(p)], 1)


class _IncB(nn.Module):
    def __init__(self, cin: int, w: float) -> None:
        super().__init__()
        self.b3 = _ConvBN(cin, _c(384, w), 3, stride=2)
        self.b3d = nn.Sequential(
            _ConvBN(cin, _c(64, w), 1),
            _ConvBN(_c(64, w), _c(96, w), 3, padding=1),
            _ConvBN(_c(96, w), _c(96, w), 3, stride=2),
        )
        self.out = _c(384, w) + _c(96, w) + cin

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b3(x), self.b3d(x), nn.functional.max_pool2d(x, 3, 2)], 1)


class _IncC(nn.Module):
    def __init__(self, cin: int, c7: int, w: float) -> None:
        super().__init__()
        o = _c(192, w)
        self.b1 = _ConvBN(cin, o, 1)
        self.b7 = nn.Sequential(
            _ConvBN(cin, c7, 1),
            _ConvBN(c7, c7, (1, 7), padding=(0, 3)),
            _ConvBN(c7, o, (7, 1), padding=(3, 0)),
        )
        self.b7d = nn.Sequential(
            _ConvBN(cin, c7, 1),
            _ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            _ConvBN(c7, c7, (1, 7), padding=(0, 3)),
            _ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            _ConvBN(c7, o, (1, 7), padding=(0, 3)),
        )
        self.bp = _ConvBN(cin, o, 1)
        self.out = 4 * o

    def forward(self, x: Tensor) -> Tensor:
        p = nn.functional.avg_pool2d(x, 3, 1, 1)
        return torch.cat([self.b1(x), self.b7(x), self.b7d(x), self.bp(p)], 1)


class _IncD(nn.Module):
    def __init__(self, cin: int, w: float) -> None:
        super().__init__()
        self.b3 = nn.Sequential(
            _ConvBN(cin, _c(192, w), 1), _ConvBN(_c(192, w), _c(320, w), 3, stride=2)
        )
        self.b7 = nn.Sequential(
            _ConvBN(cin, _c(192, w), 1),
            _ConvBN(_c(192, w), _c(192, w), (1, 7), padding=(0, 3)),
            _ConvBN(_c(192, w), _c(192, w), (7, 1), padding=(3, 0)),
            _ConvBN(_c(192, w), _c(192, w), 3, stride=2),
        )
        self.out = _c(320, w) + _c(192, w) + cin

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b3(x), self.b7(x), nn.functional.max_pool2d(x, 3, 2)], 1)


class _IncE(nn.Module):
    def __init__(self, cin: int, w: float) -> None:
        super().__init__()
        c3, c4 = _c(384, w), _c(448, w)
        self.b1 = _ConvBN(cin, _c(320, w), 1)
        self.b3 = _ConvBN(cin, c3, 1)
        self.b3a = _ConvBN(c3, c3, (1, 3), padding=(0, 1))
        self.b3b = _ConvBN(c3, c3, (3, 1), padding=(1, 0))
        self.bd = nn.Sequential(_ConvBN(cin, c4, 1), _ConvBN(c4, c3, 3, padding=1))
        self.bda = _ConvBN(c3, c3, (1, 3), padding=(0, 1))
        self.bdb = _ConvBN(c3, c3, (3, 1), padding=(1, 0))
        self.bp = _ConvBN(cin, _c(192, w), 1)
        self.out = _c(320, w) + 4 * c3 + _c(192, w)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.b3(x)
        bd = self.bd(x)
        p = nn.functional.avg_pool2d(x, 3, 1, 1)
        return torch.cat(
            [self.b1(x), self.b3a(b3), self.b3b(b3), self.bda(bd), self.bdb(bd), self.bp(p)], 1
        )


class InceptionV3(nn.Module):
    """Inception v3 (no auxiliary classifier). Expects 299x299 inputs at full size; any input
    of at least 75x75 works."""

    def __init__(self, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            _ConvBN(3, _c(32, w), 3, stride=2),
            _ConvBN(_c(32, w), _c(32, w), 3),
            _ConvBN(_c(32, w), _c(64, w), 3, padding=1),
            nn.MaxPool2d(3, 2),
            _ConvBN(_c(64, w), _c(80, w), 1),
            _ConvBN(_c(80, w), _c(192, w), 3),
            nn.MaxPool2d(3, 2),
        )
        blocks: list[nn.Module] = []
        cin = _c(192, w)
        for pool in (32, 64, 64):
            blk: _IncA | _IncB | _IncC | _IncD | _IncE = _IncA(cin, pool, w)
            blocks.append(blk)
            cin = blk.out
        blk = _IncB(cin, w)
        blocks.append(blk)
        cin = blk.out
        for c7 in (128, 160, 160, 192):
            blk = _IncC(cin, _c(c7, w), w)
            blocks.append(blk)
            cin = blk.out
        blk = _IncD(cin, w)
        blocks.append(blk)
        cin = blk.out
        for _ in range(2):
            blk = _IncE(cin, w)
            blocks.append(blk)
            cin = blk.out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


# ----------------------------------------------------------------------------- ShuffleNet v2
def _shuffle(x: Tensor, groups: int) -> Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class _ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1: nn.Module = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                nn.BatchNorm2d(cin),
                nn.Conv2d(cin, half, 1, bias=False),
                nn.BatchNorm2d(half),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Identity()
        c2 = cin if stride > 1 else half
        self.branch2 = nn.Sequential(
            nn.Conv2d(c2, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False),
            nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.branch2(b)], 1)
        else:
            out = torch.cat([self.branch1(x), self.branch2(x)], 1)
        return _shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNet v2 1.0x (stage channels 116/232/464, head 1024) scaled by ``width``."""

    def __init__(self, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        c0 = _c(24, width)
        self.stem = nn.Sequential(
            nn.Conv2d(3, c0, 3, 2, 1, bias=False),
            nn.BatchNorm2d(c0),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        units: list[nn.Module] = []
        cin = c0
        for repeats, ch in ((4, 116), (8, 232), (4, 464)):
            cout = _c(ch, width)
            units.append(_ShuffleUnit(cin, cout, 2))
            units += [_ShuffleUnit(cout, cout, 1) for _ in range(repeats - 1)]
            cin = cout
        self.stages = nn.Sequential(*units)
        head = _c(1024, width)
        self.head = nn.Sequential(
            nn.Conv2d(cin, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU(inplace=True)
        )
        self.fc = nn.Linear(head, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.fc(x.mean((2, 3)))


VISION_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": VGG16,
    "alexnet": AlexNet,
    "inception_v3": InceptionV3,
    "shufflenet_v2": ShuffleNetV2,
}
