// The .par language: model, cluster, parallel mapping and training blocks.
// Statements end at a newline or ';', so NEWLINE is a token rather than whitespace.
grammar Par;

// Items and statements are loops rather than `item (sep+ item)*` so that ANTLR's loop recovery
// skips a bad token and carries on with the next item instead of abandoning the whole file or
// block; the AST builder reports two items run together on one line.
file        : sep* (topItem sep*)* EOF ;
topItem     : includeDecl | blockDecl ;
sep         : NEWLINE | ';' ;

// The unquoted alternative is an error production: `include shared.par` is reported once, as
// a missing pair of quotes, instead of as a string of unexpected tokens.
includeDecl : 'include' (path=STRING | ~(STRING | NEWLINE | ';' | '{' | '}')*) ;
// `model NAME`, `cluster NAME`, `parallel for MODEL on CLUSTER`, `train`, or inside a block the
// name of a nested block. The header is a plain list of words checked by the AST builder, which
// can then say "expected 'for' after 'parallel'" and still check the block's contents, where a
// grammar rule per header would leave ANTLR to skip the whole block. The '{' may go on the
// next line.
blockDecl   : name+ NEWLINE* block ;

block       : '{' sep* (statement sep*)* '}' ;
statement   : layerDecl | field | includeDecl | blockDecl ;
field       : name '=' expr ;

layerDecl   : 'layer' name ':' kind=name overrides? tie? repeat? ;
overrides   : '(' (field (',' field)*)? ')' ;
tie         : 'tied' '(' name ')' ;
repeat      : 'x' expr ;

expr        : '(' expr ')'                          # parenExpr
            | op=('+' | '-') expr                   # unaryExpr
            | expr op=('*' | '/') expr              # mulExpr
            | expr op=('+' | '-') expr              # addExpr
            | NUMBER unit?                          # numberExpr
            | name '(' (callArg (',' callArg)*)? ')' # callExpr
            | name ('.' name)*                      # refExpr
            | '[' (expr (',' expr)*)? ']'           # listExpr
            | STRING                                # stringExpr
            ;
unit        : RATE_UNIT | name ;
// A call takes named arguments (`interleaved(chunks = 2)`) or values, each with an optional
// bound (`auto(1, 2, 4)`, `auto(<= 16)`).
callArg     : field | cmp=('<=' | '>=' | '<' | '>')? expr ;

// Keywords are soft: a name may be `layer` or `x`. Block keywords (model, cluster, parallel,
// for, on, train) are plain identifiers, checked by the AST builder. `1f1b` is a name although
// it starts with a digit: the lexer would otherwise read `1` `f1b`.
name        : IDENT | 'include' | 'layer' | 'tied' | 'x' | '1f1b' ;

// A byte or bit rate is one token so that `GB/s` never reads as a division.
RATE_UNIT   : [KMGTP]? 'i'? [Bb] '/s' ;
NUMBER      : DIGITS ('.' DIGITS?)? EXPONENT? | '.' DIGITS EXPONENT? ;
IDENT       : [A-Za-z_] [A-Za-z_0-9]* ;
STRING      : '"' (~["\\\r\n] | '\\' ~[\r\n])* '"' ;
NEWLINE     : '\r'? '\n' ;
WS          : [ \t]+ -> skip ;
COMMENT     : '#' ~[\r\n]* -> skip ;
LINE_CONT   : '\\' [ \t]* '\r'? '\n' -> skip ;
fragment DIGITS   : [0-9]+ ;
fragment EXPONENT : [eE] [+-]? DIGITS ;
