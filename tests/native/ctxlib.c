/* The thread-context variable in a shared library, reached with TLSDESC (-mtls-dialect=gnu2): ctx_writer -DCTX_LIB. */
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;

void ctx_set(void *rec)
{
	otel_thread_ctx_v1 = rec;
}
