"""modelzoo.quality's learnability figure: the teacher's AUC without the weights of rarely seen ids, against a
numpy reference built from the teacher's per-id weights."""

import collections

import numpy as np
import pyarrow.parquet as pq

from modelzoo import data as data_lib
from modelzoo.repository import import_datasets
from modelzoo.heads import exact_auc
from modelzoo.quality import seen_ids_teacher_auc


def test_seen_ids_teacher_auc_drops_the_weights_of_ids_seen_fewer_than_min_count_times(tmp_path):
    ds = import_datasets()
    for part, rows, seed in (("train", 3000, 0), ("test", 2000, 1)):
        ds.synthetic.generate(str(tmp_path / part), rows, scale=0.001, seed=seed, progress=False)
    ds.schema.write_meta(str(tmp_path), ds.synthetic.cardinalities(0.001), format="synthetic", scale=0.001)
    dataset = data_lib.synthetic(str(tmp_path), 0, 0, 0.001, 0, 512, 0)
    train, test = pq.read_table(dataset.train).to_pydict(), pq.read_table(dataset.test).to_pydict()
    teacher = ds.synthetic.default_teacher(0.001)
    dense = np.array([test[n] for n in ds.schema.DENSE], np.float32).T
    assert seen_ids_teacher_auc(dataset, 0) == data_lib.teacher_auc(dataset)
    for min_count in (2, 10):
        logits = (dense - teacher.dense_center) @ teacher.dense_weights + teacher.bias
        for t, name in enumerate(ds.schema.CATEGORICAL):
            seen = collections.Counter(train[name])
            ids = np.array(test[name])
            weights = teacher.id_weights(t, ids)
            logits += np.where([seen[i] >= min_count for i in ids], weights, 0.0)
        want = exact_auc(np.array(test[ds.schema.LABEL]), logits)
        assert abs(seen_ids_teacher_auc(dataset, min_count) - want) < 1e-4, min_count
    assert seen_ids_teacher_auc(dataset, 10) < seen_ids_teacher_auc(dataset, 2) < data_lib.teacher_auc(dataset)
