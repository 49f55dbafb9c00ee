"""Expert parallelism: an MoE layer whose experts are spread over ranks, tokens dispatched to them and combined
back with uneven all-to-alls (`layer`), and the `stepscope moe` benchmark that times dispatch, expert compute
and combine on spawned ranks (`benchmark`, config in `config`)."""
