"""The gluon-decode route: the Gluon decode kernel (Hopper) over batches of decodes alone."""
