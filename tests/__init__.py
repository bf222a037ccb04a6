"""cursorsync's tests: unit/ (per package, no test bed, no Spark), integration/ (the real
test bed and/or Spark), e2e/ (whole jobs through failovers); helpers in support/."""
