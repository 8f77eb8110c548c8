"""sim.core.arrays gives what np.unique gives (it stands in for np.unique's plain form, which
loads numpy.ma): the same values, order and dtype, on the arrays the simulator has."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim.core.arrays import distinct, distinct_rows

_INTS = hnp.arrays(
    st.sampled_from([np.int64, np.int32]),
    hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=12),
    elements=st.integers(-5, 5),
)
_FLOATS = hnp.arrays(
    np.float64,
    st.integers(0, 30),
    elements=st.sampled_from([0.0, 1e-6, 2.5e-6, 1e-6 + 1e-21, 3.0, 1e300]),
)


@given(st.one_of(_INTS, _FLOATS))
def test_distinct_is_np_unique(x):
    got, want = distinct(x), np.unique(x)
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()


@given(
    hnp.arrays(
        np.int64, st.tuples(st.integers(0, 20), st.integers(1, 3)), elements=st.integers(0, 3)
    )
)
def test_distinct_rows_is_np_unique_axis_0(x):
    got, want = distinct_rows(x), np.unique(x, axis=0)
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()
