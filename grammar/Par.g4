// The .par language: model, cluster, parallel mapping and training blocks.
// Statements end at a newline or ';', so NEWLINE is a token rather than whitespace.
// Keywords are soft (see `name`): a field may be called `x` or `layer`.
grammar Par;

file        : sep* (topItem (sep+ topItem)*)? sep* EOF ;
topItem     : includeDecl | modelDecl | clusterDecl | parallelDecl | trainDecl ;
sep         : NEWLINE | ';' ;

includeDecl  : 'include' STRING ;
modelDecl    : 'model' name block ;
clusterDecl  : 'cluster' name block ;
parallelDecl : 'parallel' 'for' model=name 'on' cluster=name block ;
trainDecl    : 'train' block ;

block       : '{' sep* (statement (sep+ statement)*)? sep* '}' ;
statement   : layerDecl | field | subBlock ;
field       : name '=' expr ;
subBlock    : name block ;

layerDecl   : 'layer' name ':' kind=name overrides? tie? repeat? ;
overrides   : '(' (field (',' field)*)? ')' ;
tie         : 'tied' '(' name ')' ;
repeat      : 'x' expr ;

expr        : '(' expr ')'                          # parenExpr
            | op=('+' | '-') expr                   # unaryExpr
            | expr op=('*' | '/') expr              # mulExpr
            | expr op=('+' | '-') expr              # addExpr
            | NUMBER unit?                          # numberExpr
            | name '(' (field (',' field)*)? ')'    # callExpr
            | name ('.' name)*                      # refExpr
            | '[' (expr (',' expr)*)? ']'           # listExpr
            | STRING                                # stringExpr
            ;
unit        : RATE_UNIT | name ;

// `1f1b` is a name although it starts with a digit: the lexer would otherwise read `1` `f1b`.
name        : IDENT | 'include' | 'model' | 'cluster' | 'parallel' | 'for' | 'on' | 'train'
            | 'layer' | 'tied' | 'x' | '1f1b' ;

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
