# Included by _engine.pyx: `Engine`, the forward pass and the KV and recurrent-state memory
# of a pool of slots (engine.h); pool.SlotPool holds the contracts.


# KV element types (kv_q8.h: KV_F32, KV_F16, KV_Q8_0)
_KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2}


cdef class Engine:
    """The forward pass and KV memory for `num_slots` slots of `ctx_len` tokens.

    Not thread-safe: the caller serialises calls (pool.SlotPool holds a lock)."""

    cdef engine *e
    cdef object model_file  # keeps the weights' memory map alive
    cdef readonly int num_slots, ctx_len, n_vocab, n_threads, max_batch_tokens, ring_len
    cdef readonly size_t kv_bytes, state_bytes
    cdef readonly int rollback
    cdef readonly str kernel_variant, kv_dtype

    def __cinit__(self, model_file, int num_slots, int ctx_len, int threads, str kv_dtype,
                  int max_batch_tokens, str kernels, bint swa_ring=False, int rollback=0):
        self.e = NULL
        if kv_dtype not in _KV_TYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(_KV_TYPES)}, got {kv_dtype!r}")
        if kv_dtype == "q8_0" and model_file.config.head_dim % 32:
            raise ValueError(f"kv_dtype q8_0 needs a head_dim that is a multiple of 32 "
                             f"(the model's is {model_file.config.head_dim}); use f16")
        cdef const kernel_table *kt = _select(kernels)
        cfg = model_file.config
        cdef model_desc m
        # zeroed: the weights a layer's kind lacks stay empty (NULL rows)
        cdef layer_weights *layers = <layer_weights *>calloc(cfg.n_layers, sizeof(layer_weights))
        if layers == NULL:
            raise MemoryError()
        cdef int status = ENGINE_OK
        cdef int kv_type = _KV_TYPES[kv_dtype]
        try:
            _describe(model_file, &m, layers)
            with nogil:
                self.e = engine_create(&m, kt, num_slots, ctx_len, kv_type, max_batch_tokens, threads, swa_ring,
                                       rollback, &status)
        finally:
            free(layers)
        if self.e == NULL:
            if status == ENGINE_ENOMEM:
                # per position: keys and values of an attention layer, the conv input of a conv layer
                # (none for a DeltaNet layer: its f32 state is fixed per slot, and per rollback state)
                row = sum(0 if rec else cfg.dim if conv else 2 * cfg.n_kv_heads * cfg.head_dim
                          for conv, rec in zip(cfg.conv_layers, cfg.recurrent_layers))
                state = 4 * sum(cfg.recurrent_layers) * cfg.recurrent_state_floats
                elt = {"f32": 4, "f16": 2, "q8_0": 34 / 32}[kv_dtype]
                kv_gib = (num_slots * row * (-(-ctx_len // KEY_LANES) * KEY_LANES) * elt
                          + num_slots * (1 + rollback) * state) / 2**30
                raise MemoryError(f"cannot allocate {kv_gib:.1f} GiB of KV and recurrent state for {num_slots} slots "
                                  f"x {ctx_len} tokens (plus weights and step buffers); use fewer slots or a shorter "
                                  "ctx_len")
            raise ValueError("the engine rejected the model or its arguments (shapes or types unsupported)")
        self.model_file = model_file
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.n_vocab = cfg.n_vocab
        self.n_threads = engine_n_threads(self.e)
        self.max_batch_tokens = max_batch_tokens
        self.kv_bytes = engine_kv_bytes(self.e)
        self.ring_len = engine_ring_len(self.e)
        self.kernel_variant = kt.name.decode()
        self.kv_dtype = kv_dtype
        self.state_bytes = engine_state_bytes(self.e)
        self.rollback = rollback

    def __dealloc__(self):
        if self.e != NULL:
            engine_destroy(self.e)
            self.e = NULL

    def forward(self, const int32_t[:, ::1] items, const int32_t[::1] tokens, float[:, ::1] logits,
                int fault_layer=-1):
        """items: int32 [n, 4] (slot, start_pos, n_tokens, want_logits: logits of the item's last
        that many tokens), validated by the caller; tokens: the items' ids concatenated;
        logits: float32 [sum of want_logits, n_vocab] written in place.
        Returns the engine status (0 ok, ENGINE_EFAULT when the test fault fired)."""
        cdef int n = items.shape[0], i, off = 0, n_want = 0, status
        if items.shape[1] != 4 or logits.shape[1] != self.n_vocab:
            raise ValueError("forward: bad array shapes")
        for i in range(n):
            if items[i, 3] < 0 or items[i, 3] > items[i, 2]:
                raise ValueError(f"forward: item {i} wants {items[i, 3]} logits rows of {items[i, 2]} tokens")
            n_want += items[i, 3]
        if logits.shape[0] != n_want:
            raise ValueError(f"forward: the items want {n_want} logits rows but the logits array has {logits.shape[0]}")
        cdef engine_item *its = <engine_item *>malloc(sizeof(engine_item) * max(n, 1))
        if its == NULL:
            raise MemoryError()
        cdef float *out = &logits[0, 0] if logits.shape[0] > 0 else NULL
        try:
            for i in range(n):
                its[i].slot = items[i, 0]
                its[i].start_pos = items[i, 1]
                its[i].n_tokens = items[i, 2]
                its[i].want_logits = items[i, 3]
                if off + items[i, 2] > tokens.shape[0]:
                    raise ValueError("forward: token array shorter than the items")
                its[i].tokens = &tokens[off]
                off += items[i, 2]
            with nogil:
                status = engine_forward(self.e, its, n, out, fault_layer)
        finally:
            free(its)
        if status == ENGINE_EINVAL:
            raise ValueError("forward: the engine rejected the batch (slot, position or token id out of range)")
        if status == ENGINE_EINTERNAL:
            raise RuntimeError("forward: a step walked another number of phases than the engine counted (engine bug)")
        return status

    def workers_busy(self) -> int:
        """Pool workers inside a task at this instant (engine_workers_busy; tests: 0 after any
        forward has returned)."""
        return engine_workers_busy(self.e)

    def moe_active(self) -> list:
        """Per layer, the experts the last step ran (each once for all the rows that chose it);
        0 on dense layers."""
        return [engine_moe_active(self.e, l) for l in range(self.model_file.config.n_layers)]

    def kv_snapshot_bytes(self, int n) -> int:
        """Bytes of the KV of n tokens as kv_snapshot writes them."""
        if not 0 <= n <= self.ctx_len:
            raise ValueError(f"length {n} out of range")
        return engine_kv_snapshot_bytes(self.e, n)

    def kv_snapshot(self, int slot, int n, bytes head) -> bytes:
        """bytes: `head` followed by the KV of the first n tokens of `slot` (engine_kv_read)."""
        self._check(slot, n)
        cdef Py_ssize_t hlen = len(head)
        cdef size_t kv_len = engine_kv_snapshot_bytes(self.e, n)
        out = PyBytes_FromStringAndSize(NULL, hlen + kv_len)
        cdef char *dst = PyBytes_AS_STRING(out)
        memcpy(dst, <const char *>head, hlen)
        with nogil:
            engine_kv_read(self.e, slot, n, dst + hlen)
        return out

    def kv_restore(self, int slot, int n, const uint8_t[::1] kv):
        """Overwrite the KV of the first n tokens of `slot` from bytes laid out as kv_snapshot
        writes them."""
        self._check(slot, n)
        if <size_t>kv.shape[0] != engine_kv_snapshot_bytes(self.e, n):
            raise ValueError("kv_restore: wrong KV byte count")
        if n == 0:
            return
        with nogil:
            engine_kv_write(self.e, slot, n, &kv[0])

    def kv_copy(self, int src, int dst, int n):
        self._check(src, n)
        self._check(dst, n)
        with nogil:
            engine_kv_copy(self.e, src, dst, n)

    def state_read(self, int slot, int which) -> bytes:
        """One slot's recurrent state entry `which` (engine_state_read: the state at length n is
        entry n % (rollback + 1))."""
        self._check(slot, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        out = PyBytes_FromStringAndSize(NULL, self.state_bytes)
        cdef char *dst = PyBytes_AS_STRING(out)
        with nogil:
            engine_state_read(self.e, slot, which, dst)
        return out

    def state_write(self, int slot, int which, const uint8_t[::1] state):
        """Overwrite one slot's recurrent state entry `which` with bytes laid out as state_read's."""
        self._check(slot, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        if <size_t>state.shape[0] != self.state_bytes:
            raise ValueError("state_write: wrong state byte count")
        if self.state_bytes:
            with nogil:
                engine_state_write(self.e, slot, which, &state[0])

    def state_copy(self, int src, int which, int dst):
        """dst's state entry `which` = src's (the state at one length, copied to another slot)."""
        self._check(src, 0)
        self._check(dst, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        with nogil:
            engine_state_copy(self.e, src, which, dst)

    cdef _check(self, int slot, int n):
        if not (0 <= slot < self.num_slots and 0 <= n <= self.ctx_len):
            raise ValueError(f"slot {slot} / length {n} out of range")
