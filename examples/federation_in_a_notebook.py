# %% [markdown]
# # Trying a federation from a notebook
#
# Three institutions hold tables with the same columns; each has labels for a few rows. This
# example (a script in notebook cells, `# %%`; open it in Jupyter with jupytext, or run it with
# `python examples/federation_in_a_notebook.py`) does what a data scientist does before involving
# anyone:
#
# 1. loads the three tables as pandas DataFrames (here: xclp's bundled demo data),
# 2. simulates XCLP across them on this machine and reads what each role would learn,
# 3. takes part in a real run for one institution through `xclp.client.run`, if a coordinator
#    is given (the settings cell below).
#
# Needs `pip install 'xclp[pandas]'`.

# %%
import os
from importlib.resources import files

import pandas as pd

import xclp.client
from xclp.simulation import simulate

PARTIES = ("hospital-a", "hospital-b", "hospital-c")
demo = files("xclp.demo_data")
frames = {p: pd.read_csv(demo / f"{p}.csv") for p in PARTIES}
truth = {p: pd.read_csv(demo / f"{p}.truth.csv", dtype={"true_label": str}) for p in PARTIES}
for p, df in frames.items():
    print(f"{p}: {len(df)} rows, {df.shape[1] - 2} features, {df['label'].notna().sum()} labeled")

# %% [markdown]
# ## Simulate XCLP
#
# The job is what the coordinator's operator would submit (a job file's `type` and `[params]`).
# `secure=False` runs the plaintext reference, instantly; `secure=True` runs the same protocol
# with real Paillier and masking in this process (slower) and gives the same labels.

# %%
JOB = {"type": "xclp", "params": {"n_classes": 10, "lsh_bits": 1024, "k": 5, "alpha": 0.99, "power": 3}}
sim = simulate(JOB, frames, secure=False, id_column="row_id")
print(sim.report())


def accuracy(predictions: pd.DataFrame, party: str) -> float:
    """Accuracy on the party's unlabeled rows, against the demo's held-back truth."""
    unlabeled = frames[party]["label"].isna().to_numpy()
    merged = predictions[unlabeled].merge(truth[party], left_on="id", right_on="row_id")
    return float((merged["label"] == merged["true_label"]).mean())


for p in PARTIES:
    print(f"{p}: simulated XCLP labels its unlabeled rows with accuracy {accuracy(sim[p].predictions(), p):.3f}")

# %% [markdown]
# ## Take part for real
#
# With a coordinator running the job, one institution joins with its DataFrame. The settings
# come from the environment here so that the script runs unchanged in a test; in a notebook,
# write them in. The coordinator's operator gives you the CA certificate and the allow-list;
# `xclp-client keygen` made your identity key.

# %%
settings = {
    "coordinator": os.environ.get("XCLP_COORDINATOR"),  # host:port
    "job": os.environ.get("XCLP_JOB", "xclp-demo"),
    "party": os.environ.get("XCLP_PARTY", "hospital-a"),
    "identity": os.environ.get("XCLP_IDENTITY", "keys/hospital-a.key"),
    "peers": os.environ.get("XCLP_PEERS", "allow.toml"),
    "ca_cert": os.environ.get("XCLP_CA_CERT"),
    "paillier_bits": int(os.environ.get("XCLP_PAILLIER_BITS", "2048")),  # the job's key_bits
    "insecure_test_keys": os.environ.get("XCLP_INSECURE_TEST_KEYS") == "1",
    # Paillier work in this process. The default, one process per core, is faster; a script (not a
    # notebook) then needs its run under `if __name__ == "__main__":`, as every use of
    # multiprocessing does, since the worker processes import the main module.
    "workers": 0,
}
out = os.environ.get("XCLP_OUT", "predictions.csv")

# %%
if settings["coordinator"] is None:
    print("no coordinator given (XCLP_COORDINATOR): the simulation is all this run does")
else:
    party = settings["party"]
    result = xclp.client.run(data=frames[party], id_column="row_id", **settings)
    predictions = result.predictions()
    print(f"{party}: the real run with {', '.join(result.participants)} labels its unlabeled rows with accuracy "
          f"{accuracy(predictions, party):.3f}")
    print(f"wrote {result.save(out)}")
