/**
 * `tool_choice: 'required'` nests every function's `parameters` schema inside one list schema, so a
 * `$ref` written relative to a function's own schema (`#`, `#/$defs/X`, `#/definitions/X`) would
 * resolve against the list instead and point at nothing (or at the wrong place). This moves each
 * function's schema and its definitions under the list's `$defs` with names private to the function
 * (`<prefix>`, `<prefix>.$defs.X`, `<prefix>.definitions.X`) and rewrites its references to match.
 * A schema without any `$ref` is returned as it is, with no definitions.
 */
export function hoistSchemaRefs(schema: unknown, prefix: string): { readonly schema: unknown; readonly defs: Readonly<Record<string, unknown>> } {
  if (!hasRef(schema)) return { schema, defs: {} };
  const rename = (ref: string): string => {
    if (ref === '#') return `#/$defs/${prefix}`;
    const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(ref);
    // Other forms are left for the schema compiler to refuse, naming the reference.
    return m === null ? ref : `#/$defs/${prefix}.${m[1]!}.${m[2]!}`;
  };
  const rewrite = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(rewrite);
    if (typeof v !== 'object' || v === null) return v;
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = k === '$ref' && typeof x === 'string' ? rename(x) : rewrite(x);
    return out;
  };
  const defs: Record<string, unknown> = {};
  const { $defs, definitions, ...root } = schema as Record<string, unknown>;
  for (const [key, table] of [['$defs', $defs], ['definitions', definitions]] as const) {
    if (typeof table !== 'object' || table === null) continue;
    for (const [name, def] of Object.entries(table)) defs[`${prefix}.${key}.${name}`] = rewrite(def);
  }
  defs[prefix] = rewrite(root);
  return { schema: { $ref: `#/$defs/${prefix}` }, defs };
}

/** Whether `v` holds a `$ref` anywhere. */
function hasRef(v: unknown): boolean {
  if (Array.isArray(v)) return v.some(hasRef);
  if (typeof v !== 'object' || v === null) return false;
  return Object.entries(v).some(([k, x]) => k === '$ref' || hasRef(x));
}
