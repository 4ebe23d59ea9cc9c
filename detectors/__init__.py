"""Pure detection algorithms: arrays in, findings out. No database, clock or network."""
