#include "parc/Support/NameSuggest.h"
#include <gtest/gtest.h>

using namespace parc;

TEST(NameSuggest, FindsCloseMisspelling) {
  llvm::StringRef fields[] = {"hidden", "heads", "kv_heads", "vocab"};
  EXPECT_EQ(suggestName("hiden", fields), "hidden");
  EXPECT_EQ(suggestName("kvheads", fields), "kv_heads");
  EXPECT_EQ(didYouMean("vocb", fields), "; did you mean 'vocab'?");
}

TEST(NameSuggest, StaysQuietWhenNothingIsClose) {
  llvm::StringRef fields[] = {"hidden", "heads"};
  EXPECT_FALSE(suggestName("optimizer", fields).has_value());
  EXPECT_EQ(didYouMean("zz", fields), "");
}

TEST(NameSuggest, CaseOnlyDifferenceIsSuggested) {
  llvm::StringRef units[] = {"GiB", "GB"};
  EXPECT_EQ(suggestName("GIB", units), "GiB");
}
