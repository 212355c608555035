"""Comparing two ledger files as the same run recorded twice: all but what names the file."""

import numpy as np


def same_ledger_bytes(a, b):
    """Every member byte for byte, and the meta but for what names the file (writer, times, pid: _schema.PER_FILE_META)."""
    import json
    import zipfile

    from stepledger.format import schema as S
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names = [i.filename for i in za.infolist()]
        assert names == [i.filename for i in zb.infolist()]
        for name in names:
            if name == S.META_MEMBER + ".npy":
                continue
            assert za.read(name) == zb.read(name), name
    metas = []
    for path in (a, b):
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z[S.META_MEMBER]))
        assert meta[S.META_WRITER] and meta[S.META_STATE] == S.STATE_CLOSED
        metas.append({k: v for k, v in meta.items() if k not in S.PER_FILE_META})
    return metas[0] == metas[1]
