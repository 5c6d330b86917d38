"""Gradient sets for the Python benchmarks: a shared data file (`index name dtype shape` per line,
the format of the shared data folder's README, with the rules of benchmarks/gradient_set.cc), or
the synthetic set of gradsync_bench_models."""

import os


class SetError(Exception):
    pass


def parse_gradient_set(path):
    """[(name, shape tuple)] in registration order; SetError("path:line: why") if malformed."""
    tensors, seen = [], set()
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            where = "%s:%d: " % (path, line_no)
            fields = text.split()
            if len(fields) != 4:
                raise SetError(where + "expected 'index name dtype shape', got %r" % text)
            index, name, dtype, shape_text = fields
            if not index.isdigit() or int(index) != len(tensors):
                raise SetError(where + "index %r out of sequence, expected %d"
                               % (index, len(tensors)))
            if name in seen:
                raise SetError(where + "duplicate tensor name %r" % name)
            # The benchmark measures float32 gradients whatever the file says, as the C++
            # benchmarks do; the dtype is read only to reject a malformed line.
            if not dtype.isidentifier():
                raise SetError(where + "bad dtype %r" % dtype)
            dims = shape_text.split("x")
            if not all(d.isdigit() and int(d) >= 1 for d in dims):
                raise SetError(where + "bad shape %r" % shape_text)
            seen.add(name)
            tensors.append((name, tuple(int(d) for d in dims)))
    if not tensors:
        raise SetError(path + ": no tensors")
    return tensors


# The synthetic set of gradsync_bench_models: 1000 tensors of 256 float32 (1 KB) each.
SYNTHETIC_SET = "1000x1KB"


def synthetic_tensors():
    return [("t%d" % i, (256,)) for i in range(1000)]


def resolve_set(set_arg, data_dir):
    """A path to a set file, a stem looked up in the data folder (`resnet50`), or the synthetic
    set's name (`1000x1KB`, whose path is None)."""
    if set_arg == SYNTHETIC_SET:
        return set_arg, None
    if os.sep in set_arg or set_arg.endswith(".txt"):
        path = set_arg
    else:
        path = os.path.join(data_dir, set_arg + ".txt")
    name = os.path.splitext(os.path.basename(path))[0]
    return name, path
