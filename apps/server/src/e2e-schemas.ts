// Test-only (not exported from the package): the 50 JSON schemas of the client e2e suite
// (clients.e2e.test.ts), each with a name usable as an OpenAI schema or function name.
//
// NOTE: every string has a maxLength (or an enum, const or pattern of bounded length), every array a
// maxItems and there is no recursion, so each schema's language is finite up to number fractions.
// The bundled fixture model has random weights: nothing but the constraint makes it close a
// string or an array, and a schema that allowed unbounded values would let it run into max_tokens
// (as with vLLM and xgrammar, which do not bound them either). Fractions are the one unbounded part
// (JSON numbers have no length limit; a terminator is allowed after every digit, so a random
// model ends them within a few tokens), and the suite checks that every response finished with `stop`.

/** A JSON schema object. */
export type Schema = Record<string, unknown>;

const str = (maxLength: number, minLength = 0): Schema => ({ type: 'string', minLength, maxLength });
const int = (minimum: number, maximum: number): Schema => ({ type: 'integer', minimum, maximum });
const num = (minimum: number, maximum: number): Schema => ({ type: 'number', minimum, maximum });
const bool: Schema = { type: 'boolean' };
const oneOfValues = (...values: unknown[]): Schema => ({ enum: values });
const arr = (items: Schema, maxItems: number, minItems = 0): Schema => ({ type: 'array', items, minItems, maxItems });
/** An object of `properties`, all required unless `required` lists fewer; no other properties. */
const obj = (properties: Record<string, Schema>, required: string[] = Object.keys(properties)): Schema => ({ type: 'object', properties, required, additionalProperties: false });

/** The suite's schemas: nested objects, arrays, enums, const, anyOf/oneOf, bounded numbers, patterns, $defs, optional members. */
export const E2E_SCHEMAS: readonly { readonly name: string; readonly schema: Schema }[] = [
  { name: 'person', schema: obj({ name: str(8, 1), age: int(0, 120) }) },
  { name: 'color_tags', schema: obj({ color: oneOfValues('red', 'green', 'blue'), tags: arr(str(4), 3) }) },
  { name: 'point', schema: obj({ x: num(-10, 10), y: num(0, 1) }) },
  { name: 'flag', schema: obj({ ok: bool }) },
  { name: 'optional_fields', schema: obj({ id: int(1, 999), note: str(6), done: bool }, ['id']) },
  { name: 'nested_address', schema: obj({ user: obj({ name: str(6, 1), address: obj({ city: oneOfValues('Paris', 'Tokyo', 'Lima'), zip: { type: 'string', pattern: '^[0-9]{5}$' } }) }) }) },
  { name: 'int_list', schema: obj({ values: arr(int(-5, 5), 4, 1) }) },
  { name: 'matrix', schema: obj({ rows: arr(arr(int(0, 9), 3, 1), 3, 1) }) },
  { name: 'any_of_scalar', schema: obj({ v: { anyOf: [int(1, 9), { type: 'null' }, str(3)] } }) },
  { name: 'shape_union', schema: obj({ shape: { anyOf: [obj({ kind: { const: 'circle' }, r: num(0, 5) }), obj({ kind: { const: 'rect' }, w: int(1, 9), h: int(1, 9) })] } }) },
  { name: 'one_of_ids', schema: obj({ ref: { oneOf: [int(100, 199), { type: 'string', pattern: '^id-[a-z]{3}$' }] } }) },
  { name: 'mixed_enum', schema: obj({ level: oneOfValues(1, 2, 3, 'max', null, true) }) },
  { name: 'const_version', schema: obj({ version: { const: 'v1' }, build: int(0, 99) }) },
  { name: 'nullable_type', schema: obj({ label: { type: ['string', 'null'], maxLength: 5 }, count: { type: ['integer', 'null'], minimum: 0, maximum: 3 } }) },
  { name: 'exclusive_bounds', schema: obj({ p: { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 }, q: { type: 'number', exclusiveMinimum: -1, maximum: 1 } }) },
  { name: 'negative_range', schema: obj({ t: int(-273, -200), dt: num(-3, -1) }) },
  { name: 'order', schema: obj({ order_id: int(1000, 9999), items: arr(obj({ sku: str(5, 2), qty: int(1, 5) }), 3, 1), paid: bool }) },
  { name: 'calendar_event', schema: obj({ title: str(10, 1), day: int(1, 31), month: oneOfValues('jan', 'feb', 'mar', 'apr'), attendees: arr(str(5, 1), 3) }, ['title', 'day', 'month']) },
  { name: 'rgb', schema: obj({ r: int(0, 255), g: int(0, 255), b: int(0, 255), alpha: num(0, 1) }, ['r', 'g', 'b']) },
  { name: 'defs_ref', schema: { $defs: { money: obj({ amount: int(0, 500), currency: oneOfValues('EUR', 'USD') }) }, type: 'object', properties: { price: { $ref: '#/$defs/money' }, tax: { $ref: '#/$defs/money' } }, required: ['price', 'tax'], additionalProperties: false } },
  { name: 'definitions_ref', schema: { definitions: { tag: str(4, 1) }, type: 'object', properties: { tags: arr({ $ref: '#/definitions/tag' }, 3) }, required: ['tags'], additionalProperties: false } },
  { name: 'string_bounds', schema: obj({ code: str(3, 3), hint: str(6, 2) }) },
  { name: 'patterns', schema: obj({ plate: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' }, hex: { type: 'string', pattern: '^#[0-9a-f]{6}$' } }) },
  { name: 'bool_array', schema: obj({ bits: arr(bool, 8, 8) }) },
  { name: 'enum_array', schema: obj({ days: arr(oneOfValues('mon', 'tue', 'wed', 'thu', 'fri'), 5, 1) }) },
  { name: 'deep_nesting', schema: obj({ a: obj({ b: obj({ c: obj({ d: int(0, 3) }) }) }) }) },
  { name: 'array_of_unions', schema: obj({ events: arr({ anyOf: [obj({ click: obj({ x: int(0, 99), y: int(0, 99) }) }), obj({ key: oneOfValues('a', 'b', 'enter') })] }, 3, 1) }) },
  { name: 'weather', schema: obj({ city: oneOfValues('Paris', 'Tokyo'), unit: oneOfValues('c', 'f'), temp: num(-40, 50), wind: int(0, 200) }) },
  { name: 'all_optional', schema: obj({ a: int(0, 9), b: str(3), c: bool }, []) },
  { name: 'sentiment', schema: obj({ label: oneOfValues('positive', 'negative', 'neutral'), score: num(0, 1) }) },
  { name: 'pagination', schema: obj({ page: int(1, 50), per_page: oneOfValues(10, 20, 50), total: int(0, 10000) }) },
  { name: 'key_values', schema: obj({ pairs: arr(obj({ k: str(3, 1), v: { anyOf: [int(0, 99), bool] } }), 4) }) },
  { name: 'allof_single', schema: obj({ x: { allOf: [int(0, 7)] } }) },
  { name: 'description_heavy', schema: { type: 'object', description: 'A product card.', properties: { title: { ...str(8, 1), description: 'Short title' }, stars: { ...int(1, 5), description: 'Rating' } }, required: ['title', 'stars'], additionalProperties: false } },
  { name: 'type_list', schema: obj({ value: { type: ['integer', 'boolean'], minimum: 0, maximum: 9 } }) },
  { name: 'geo', schema: obj({ lat: num(-90, 90), lon: num(-180, 180), label: str(6) }, ['lat', 'lon']) },
  { name: 'tree_two_levels', schema: obj({ root: obj({ name: str(3, 1), children: arr(obj({ name: str(3, 1), leaf: bool }), 2) }) }) },
  { name: 'choice_object', schema: obj({ answer: oneOfValues('yes', 'no', 'maybe'), confidence: int(0, 100) }) },
  { name: 'version_triplet', schema: obj({ major: int(0, 9), minor: int(0, 99), patch: int(0, 99), pre: { anyOf: [{ type: 'null' }, oneOfValues('alpha', 'beta', 'rc')] } }) },
  { name: 'http_request', schema: obj({ method: oneOfValues('GET', 'POST', 'PUT', 'DELETE'), path: { type: 'string', pattern: '^/[a-z]{1,8}$' }, status: int(100, 599) }) },
  { name: 'invoice_lines', schema: obj({ lines: arr(obj({ desc: str(6, 1), cents: int(1, 99999) }), 3, 1), currency: { const: 'EUR' } }) },
  { name: 'scores_table', schema: obj({ scores: arr(obj({ team: oneOfValues('red', 'blue'), points: int(0, 30) }), 2, 2) }) },
  { name: 'nullable_nested', schema: obj({ manager: { anyOf: [{ type: 'null' }, obj({ name: str(5, 1), level: int(1, 3) })] } }) },
  { name: 'min_items', schema: obj({ ids: arr(int(0, 9), 5, 3) }) },
  { name: 'unicode_choices', schema: obj({ word: oneOfValues('café', 'naïve', 'straße', '日本') }) },
  { name: 'escaped_strings', schema: obj({ quote: oneOfValues('say "hi"', 'back\\slash', 'tab\there'), raw: str(4) }) },
  { name: 'temperature_series', schema: obj({ readings: arr(num(-5, 5), 4, 2), sensor: int(1, 8) }) },
  { name: 'profile_with_settings', schema: obj({ user: str(6, 1), settings: obj({ theme: oneOfValues('dark', 'light'), font: int(10, 24), beta: bool }, ['theme']) }) },
  { name: 'ranges_mixed', schema: obj({ small: int(0, 1), big: int(100000, 100100), neg: int(-12, 12) }) },
  { name: 'tool_like', schema: obj({ action: oneOfValues('search', 'lookup', 'finish'), query: str(10), top_k: int(1, 5) }, ['action']) },
];

