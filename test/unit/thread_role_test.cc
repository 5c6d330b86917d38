#include "runtime/thread_role.h"

#include <gtest/gtest.h>

#include <thread>

namespace gradsync {
namespace {

TEST(ThreadRoleTest, ABackgroundWorkScopeMarksTheThreadUntilItEnds) {
  std::thread caller([] {
    EXPECT_FALSE(OnBackgroundThread());
    {
      BackgroundWorkScope scope;
      EXPECT_TRUE(OnBackgroundThread());
      {
        BackgroundWorkScope nested;
        EXPECT_TRUE(OnBackgroundThread());
      }
      EXPECT_TRUE(OnBackgroundThread()) << "a nested scope ended the outer one";
    }
    EXPECT_FALSE(OnBackgroundThread());
  });
  caller.join();
  EXPECT_FALSE(OnBackgroundThread()) << "another thread's scope marked this one";
}

TEST(ThreadRoleTest, GradsyncsOwnThreadsStayMarkedAfterAScope) {
  std::thread own([] {
    MarkBackgroundThread();
    { BackgroundWorkScope scope; }
    EXPECT_TRUE(OnBackgroundThread());
  });
  own.join();
}

}  // namespace
}  // namespace gradsync
