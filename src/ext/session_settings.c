/*
 * session_settings.c: wal_delivery.setting_changed_here(), the name of a setting (GUC)
 * changed since the caller's current subtransaction began, or NULL.
 *
 * Why: a SQL processor runs in the worker's session. A plain SET inside a function
 * outlives the function, even one with its own SET clause for that setting (Postgres
 * keeps the session value an ordinary SET gives), so a processor that ran SET search_path
 * would have the rest of run_sql_processor_row, and the worker's next statements, resolve
 * names through its own schema, with the worker's rights. run_sql_processor_row calls
 * this right after the processor, inside the subtransaction that holds it, and refuses
 * the attempt when a setting changed: the subtransaction's abort puts every value back.
 *
 * How: each subtransaction and each function with a SET clause opens a GUC nesting level,
 * and a setting changed at some level keeps an entry on its stack at that level (merged
 * into the enclosing level when a function or subtransaction ends well) until the level
 * ends. A setting whose top entry is at the caller's level or deeper was changed since
 * that level began.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "pg_compat.h"

PG_FUNCTION_INFO_V1(wal_delivery_setting_changed_here);

Datum
wal_delivery_setting_changed_here(PG_FUNCTION_ARGS)
{
	/* The caller's level: open one above it and close it again at once. */
	int level = NewGUCNestLevel();
	int n;
	struct config_generic **vars;
	const char *changed = NULL;

	AtEOXact_GUC(true, level);
	level--;
	vars = compat_get_guc_variables(&n);
	for (int i = 0; i < n && changed == NULL; i++)
		if (vars[i]->stack != NULL && vars[i]->stack->nest_level >= level)
			changed = vars[i]->name;
	compat_free_guc_variables(vars);
	if (changed == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(changed));
}
