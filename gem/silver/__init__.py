"""Silver transforms: pure DataFrame functions that turn bronze rows (and the previous silver rows)
into the silver tables; the jobs/ modules read their inputs, call these and commit the results."""
