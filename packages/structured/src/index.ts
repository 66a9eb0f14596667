export { StructuredCode, StructuredError, type StructuredErrorCode } from './errors.js';
export { type Expr, type Grammar, alt, byteSet, bytes, lit, opt, ref, rep, seq } from './grammar.js';
export { Automaton } from './automaton.js';
export { Vocabulary, type VocabSource, vocabularyOf } from './vocab.js';
export { CompiledGrammar, GrammarMatcher, type TokenBitmask, applyMask, maskHas } from './matcher.js';
export { type JsonSchemaOptions, jsonObjectGrammar, jsonSchemaGrammar } from './json-schema.js';
export { type RegexOptions, compileRegexBody, regexGrammar } from './regex.js';
export { gbnfGrammar } from './gbnf.js';
export { type ConstraintSpec, GrammarCache, grammarOf, specKey } from './spec.js';
