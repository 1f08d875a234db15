"""Evidence: evaluating policies on fixed noise, comparing methods at equal compute,
and the HTML report."""
