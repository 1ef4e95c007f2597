"""The regimes benchmarks' PyTorch models (``regimes.py`` through Horovod, ``ddp_regimes.py``
through DDP; ``regimes.py``'s docstring describes them), their synthetic batches, the user's
optimizer of each, one training step, and a timed configuration that trains a model
(``Trained``)."""
import torch

from rounds import Timed

nn = torch.nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.down = _shortcut(cin, width, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.down(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.down = _shortcut(cin, width * 4, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + self.down(x))


def _shortcut(cin, cout, stride):
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7 stem, max pool, four stages, global pool, fc."""

    def __init__(self, block, counts, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, n in enumerate(counts):
            width = 64 << i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(
            self.stages(self.stem(x)), 1), 1))


class GPT(nn.Module):
    """A GPT-style causal LM: token + position embeddings, pre-norm blocks, tied output."""

    def __init__(self, layers, vocab=8192, d=512, heads=8, ff=2048, seq=64):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:tokens.shape[1]]
        h = self.norm(self.body(h, mask=self.mask, is_causal=True))
        return h @ self.embed.weight.t()


def build(args):
    torch.manual_seed(0)
    if args.model == "gpt":
        return GPT(args.layers, seq=args.seq)
    return ResNet(*{"resnet18": (BasicBlock, [2, 2, 2, 2]),
                    "resnet50": (Bottleneck, [3, 4, 6, 3])}[args.model])


def make_batch(args, gen):
    if args.model == "gpt":
        tokens = torch.randint(0, 8192, (args.batch, args.seq + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]
    return (torch.randn(args.batch, 3, args.image, args.image, generator=gen),
            torch.randint(0, 1000, (args.batch,), generator=gen))


def user_optimizer(args, model):
    if args.model == "gpt":
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.01)  # as Horovod's synthetic benchmark


def one_step(model, opt, batch):
    opt.zero_grad()
    out = model(batch[0])
    nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch[1].reshape(-1)).backward()
    opt.step()


def add_args(ap):
    """The model arguments both benchmarks take."""
    ap.add_argument("--model", choices=("resnet18", "resnet50", "gpt"), default="resnet18")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)


class Trained(Timed):
    """A configuration (``rounds.Timed``) whose step trains ``model`` with ``opt``."""

    def __init__(self, method, comp, model, opt):
        super().__init__(method, comp)
        self.model, self.opt = model, opt

    def one_step(self, batch):
        one_step(self.model, self.opt, batch)

    def drop(self):
        self.model = self.opt = self.comp = None
