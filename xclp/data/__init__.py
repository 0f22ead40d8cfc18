"""A party's table: reading it (`tables`: CSV, Parquet, Arrow, pandas, arrays; `columns`: what
every reader shares), what it holds once read (`party_table`), its checks (`validation`), and the
preparation every job may ask for (`prep`: imputation and standardisation from pooled moments)."""
