"""The MLA routes: the Triton MLA kernel (mla) and the Gluon one (gluon-mla, Hopper), and their plan."""
