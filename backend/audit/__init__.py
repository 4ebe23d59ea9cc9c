"""The audit trail: who or what did what to a job's recovery, one append-only row each."""
