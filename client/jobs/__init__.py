"""The party's half of each job type: what it contributes and what it makes of the aggregate."""
