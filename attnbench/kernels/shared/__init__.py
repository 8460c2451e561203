"""What the routes share: the plan tables, the variants' inputs, launch arguments, Gluon host checks, device helpers."""
