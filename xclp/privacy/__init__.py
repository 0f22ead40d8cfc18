"""Differential privacy: the noise (`noise`: Laplace, discrete Laplace, Skellam and their
distributed shares), the accountant (`accounting`: Rényi DP of the Skellam mechanism, composed
and converted by dp-accounting), and the DP releases built on them: DP-SGD for training
(`dpsgd`), label-DP for XCLP (`label_dp`), the DP moments of the preparation (`dp_moments`).
docs/privacy.md says what each guarantees."""
