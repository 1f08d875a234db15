"""Running a training job: start and place the actors, publish weights, drive the
iterations, record and export (the driver calls thin actors around the cores)."""
