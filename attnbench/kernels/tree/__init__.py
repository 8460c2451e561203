"""The gluon-tree route: the Gluon tree kernel (Hopper) over batches with trees."""
