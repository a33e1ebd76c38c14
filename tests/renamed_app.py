"""The sales example's running totals under the name in ``EVENTFOLD_TEST_PROJECTION``: for
tests that run a projection of their own in a CLI process (``EVENTFOLD_APP=
tests.renamed_app:app``), beside other tests on the same stack."""

from __future__ import annotations

import dataclasses
import os

from eventfold import Eventfold
from examples import sales

app = Eventfold("renamed")
app.projections.add(dataclasses.replace(
    sales.sales_totals, name=os.environ["EVENTFOLD_TEST_PROJECTION"], table="", ktable_topic=""))
